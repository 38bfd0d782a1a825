"""Links between processes (csrc/pipeline/remote.h), on their own: two
processes (gloo) each run a PipelineCore over half of a model's units,
connected by RemoteSpec, without PipelineParallel or a mesh around them."""

import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pipelstm._C import pipeline as _engine
from pipelstm.pipeline.balance import estimate_costs
from pipelstm.pipeline.core import PipelineCore
from pipelstm.pipeline.units import flatten

from distributed_utils import needs_gloo

pytestmark = needs_gloo

K, M = 3, 2
T, B = 6, 4


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(23, 8), nn.LSTM(8, 12, num_layers=2), nn.Linear(12, 23)).double()


def _tokens() -> torch.Tensor:
    return torch.randint(0, 23, (T, B), generator=torch.Generator().manual_seed(1))


def _core(units) -> PipelineCore:
    return PipelineCore(units, [torch.device("cpu")], [len(units)], 1, chunks=K, micro_batches=M, who="test")


def _worker(rank: int, store_path: str, out_dir: str, case: str) -> None:
    result = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
        group = dist.group.WORLD.group_name
        model = _model()
        units = flatten(model.named_children())
        estimate_costs(units)
        cut = 2  # rank 0: the embedding and layer 0; rank 1: layer 1 and the decoder
        mine = units[:cut] if rank == 0 else units[cut:]
        core = _core(mine)
        timeout = 2.0 if case == "silent" else 60.0
        prev = None if rank == 0 else _engine.RemoteSpec(group, 0, "stage 0 (rank 0)")
        nxt = _engine.RemoteSpec(group, 1, "stage 1 (rank 1)") if rank == 0 else None
        core.connect(prev, nxt, timeout, rank, 0 if rank == 0 else cut, f"rank {rank}")  # one stage per process
        L = core.num_layers
        if case == "silent" and rank == 0:
            # Never runs, but stays alive: rank 1 waits for activations that
            # do not come. (A barrier can't tell when: rank 1's timed-out
            # receive closes the connection.)
            done = os.path.join(out_dir, "rank1.pt")
            deadline = time.monotonic() + 120
            while not os.path.exists(done) and time.monotonic() < deadline:
                time.sleep(0.05)
        elif rank == 0:
            out, _, _ = core.run(_tokens(), [None] * L, [None] * L, training=True)
            out.backward(torch.empty_like(out))
        else:
            x = torch.empty(T, B, 12, dtype=torch.float64, device="meta")
            try:
                out, _, _ = core.run(x, [None] * L, [None] * L, training=True)
                out.pow(2).sum().backward()
                result["output"] = out.detach()
            except RuntimeError as e:
                result["error"] = str(e)
        result["grads"] = {name: p.grad for name, p in model.named_parameters()
                           if any(p is q for u in mine for q in u.params())}
        if case != "silent":
            dist.barrier()
    except Exception:
        result["crash"] = traceback.format_exc()
    path = os.path.join(out_dir, f"rank{rank}.pt")
    torch.save(result, path + ".tmp")
    os.replace(path + ".tmp", path)  # whole, for the peer that polls for it
    if dist.is_initialized():
        dist.destroy_process_group()


def _spawn(tmp_path, case: str, limit: float = 120.0):
    """Runs both ranks; a run still going after `limit` seconds (a link that
    never times out) is killed and fails the test instead of hanging it."""
    ctx = mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path), case), nprocs=2,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + limit
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the two ranks were still running after {limit:.0f} s")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r, res in enumerate(results):
        assert "crash" not in res, f"rank {r}:\n{res['crash']}"
    return results


def test_items_cross_between_processes_as_in_the_unsplit_model(tmp_path):
    r0, r1 = _spawn(tmp_path, "train")
    assert "error" not in r1, r1.get("error")
    ref = _model()
    h, _ = ref[1](ref[0](_tokens()))
    out = ref[2](h)
    out.pow(2).sum().backward()
    torch.testing.assert_close(r1["output"], out.detach())
    grads = {**r0["grads"], **r1["grads"]}
    assert set(grads) == {name for name, _ in ref.named_parameters()}
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)


def test_a_silent_peer_ends_in_an_error_naming_it(tmp_path):
    _, r1 = _spawn(tmp_path, "silent")
    assert "output" not in r1
    message = r1["error"]
    assert "stage 0 (rank 0)" in message and "timed out after 2 s" in message, message
    assert "waiting for the activations of micro-batch 0, chunk 0" in message, message
