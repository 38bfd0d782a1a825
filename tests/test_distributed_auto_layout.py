"""init_mesh(pp="auto") and PipelineParallel(chunks="auto", micro_batches="auto")
over 2 gloo processes: rank 0 plans (its units calibrated, the link timed
over the job's group), every rank runs the same plan, and a step trains."""

import multiprocessing as mp
import os
import traceback

import pytest
import torch
import torch.distributed as dist
from torch import nn

import pipelstm
from distributed_utils import free_port, needs_gloo

pytestmark = needs_gloo

T, B, V = 12, 8, 50


def small_lm() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(V, 16), pipelstm.LSTM(16, 32, num_layers=2), nn.Linear(32, V))


def _rank(rank: int, port: int, results, case: str) -> None:
    import pipelstm.distributed as pdist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        model, loss = small_lm(), nn.CrossEntropyLoss()
        if case == "auto":
            mesh = pdist.init_mesh(pp="auto", model=model, sample=(T, B), loss_fn=loss, timeout=120)
            pipe = pdist.PipelineParallel(model, mesh, chunks="auto", micro_batches="auto", loss_fn=loss,
                                          threads=1)
        else:  # a fixed pp=2: K and M planned for the sample PipelineParallel is given
            mesh = pdist.init_mesh(pp=2, timeout=120)
            pipe = pdist.PipelineParallel(model, mesh, chunks="auto", micro_batches="auto", loss_fn=loss,
                                          threads=1, sample=(T, B))
        g = torch.Generator().manual_seed(1)
        x, y = torch.randint(0, V, (T, B), generator=g), torch.randint(0, V, (T, B), generator=g)
        value = float(pipe.train_step(mesh.shard(x), mesh.shard(y)))
        results.put((rank, dict(dp=mesh.dp, pp=mesh.pp, chunks=pipe.core.chunks, M=pipe.core.micro_batches,
                                balance=list(pipe.balance), loss=value,
                                plan=None if mesh.layout_choice is None else mesh.layout_choice.layout)))
    except Exception:
        results.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_two(case: str):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, results, case)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    for r, v in got.items():
        assert isinstance(v, dict), f"rank {r} failed:\n{v}"
    return got


def test_auto_layout_is_the_same_on_every_rank_and_trains():
    got = run_two("auto")
    assert got[0] == got[1]
    r = got[0]
    layout = r["plan"]
    assert (r["dp"], r["pp"], r["chunks"], r["M"]) == (layout.dp, layout.pp, layout.chunks, layout.micro_batches)
    # The plan's balance counts the loss in the last stage; the pipeline's does not.
    assert r["balance"] == list(layout.balance[:-1]) + [layout.balance[-1] - 1]
    assert 0 < r["loss"] < 10


def test_auto_chunks_on_a_fixed_mesh_plan_for_the_sample():
    got = run_two("fixed")
    assert got[0] == got[1]
    assert got[0]["pp"] == 2 and got[0]["plan"] is None


def test_auto_needs_a_model_and_a_sample(monkeypatch):
    import pipelstm.distributed as pdist

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="pp='auto' needs model= and sample="):
        pdist.init_mesh(pp="auto", model=small_lm())
    with pytest.raises(ValueError, match="pp must be a positive int or 'auto'"):
        pdist.init_mesh(pp="two")


def test_plan_layout_checks_its_sample():
    import pipelstm.distributed as pdist

    with pytest.raises(ValueError, match=r"plan_layout: sample must be \(T, B\)"):
        pdist.plan_layout(small_lm(), (12,), world_size=2)
