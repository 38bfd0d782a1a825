"""pipelstm/distributed/mesh.py: which backend and device init_mesh picks
for the GPUs a machine has (the GPU counts are simulated: the rule is
checked here on any machine; tests/gpu/test_gpu_stack.py runs it on one)."""

import subprocess
import sys

import pytest
import torch

from distributed_utils import ROOT, TRAIN_LM, env
from pipelstm.distributed import backend_threads, mesh


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return set_count


@pytest.mark.parametrize("count,local_world,device,backend,expected", [
    (0, 2, None, None, ("gloo", "cpu")),
    (2, 2, None, None, ("nccl", "cuda:1")),  # a GPU per process: NCCL, the local rank's GPU
    (1, 2, None, None, ("gloo", "cpu")),  # NCCL would refuse two ranks on one GPU
    (1, 2, "cuda", None, ("gloo", "cuda:0")),  # asked for: the GPU shared over gloo
    (2, 2, "cpu", None, ("gloo", "cpu")),
    (2, 2, None, "gloo", ("gloo", "cpu")),
    (2, 2, "cuda", "gloo", ("gloo", "cuda:1")),
    (4, 2, None, "nccl", ("nccl", "cuda:1")),
], ids=["no-gpu", "gpu-each", "one-gpu-two-ranks", "shared-gpu", "cpu-asked", "gloo-asked", "gloo-cuda",
        "nccl-asked"])
def test_backend_and_device(gpus, count, local_world, device, backend, expected):
    gpus(count)
    got_backend, got_device = mesh._pick(device, backend, local_rank=1 if local_world > 1 else 0,
                                         local_world=local_world)
    assert (got_backend, str(got_device)) == expected


@pytest.mark.parametrize("count,device,backend,message", [
    (0, "cuda", None, "no GPU is visible"),
    (1, None, "nccl", "NCCL refuses two ranks on one device"),
    (2, "cpu", "nccl", "carries GPU tensors only"),
    (2, "tpu", None, "device must be 'cpu', 'cuda' or None"),
    (2, None, "mpi", "backend must be 'gloo', 'nccl' or None"),
])
def test_impossible_requests_say_why(gpus, count, device, backend, message):
    gpus(count)
    with pytest.raises(ValueError, match=message):
        mesh._pick(device, backend, local_rank=0, local_world=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_the_example_asked_for_a_gpu_it_does_not_have_says_why_without_a_traceback():
    result = subprocess.run([sys.executable, str(TRAIN_LM), "--device", "cuda", "--max-steps", "1"],
                            capture_output=True, text=True, timeout=120, env=env(), cwd=ROOT)
    assert result.returncode == 1
    assert "train_lm.py: pipelstm.distributed.init_mesh: device='cuda', but no GPU is visible here" in result.stderr
    assert "Traceback" not in result.stderr


# --- the DeviceMesh behind the mesh ---------------------------------------------------

class _MeshLayout:
    """A Group workload: init_mesh(pp=2) on 4 processes, and what its groups hold."""

    def __init__(self, rank: int, world: int) -> None:
        import torch.distributed as dist

        self.mesh = mesh.init_mesh(pp=2, timeout=60)
        m, dm = self.mesh, self.mesh.device_mesh
        self.found = dict(
            shape=tuple(dm.shape), names=dm.mesh_dim_names, layout=dm.mesh.tolist(),
            pp_is_mesh_group=dm.get_group("pp") is m.pp_group, dp_is_mesh_group=dm.get_group("dp") is m.dp_group,
            pp_group_ranks=dist.get_process_group_ranks(m.pp_group), pp_ranks=m.pp_ranks,
            dp_group_ranks=dist.get_process_group_ranks(m.dp_group), dp_ranks=m.dp_ranks,
            coordinate=tuple(dm.get_coordinate()), dp_rank=m.dp_rank, pp_rank=m.pp_rank,
        )
        self.sums = None

    def step(self) -> None:
        import torch.distributed as dist

        sums = []
        for group in (self.mesh.pp_group, self.mesh.dp_group):
            t = torch.tensor([float(self.mesh.rank)])
            dist.all_reduce(t, group=group)
            sums.append(t.item())
        self.sums = sums

    def info(self) -> dict:
        return dict(self.found, sums=self.sums)


def setup_mesh_layout(rank: int, world: int) -> _MeshLayout:
    return _MeshLayout(rank, world)


def test_the_mesh_is_a_dp_by_pp_device_mesh_whose_groups_it_uses():
    from pipelstm.bench.groups import Group

    with Group("dp=2 x pp=2", 4, setup_mesh_layout, timeout=300) as g:
        g.step()
        infos = g.last
    for rank, info in enumerate(infos):
        dp_rank, pp_rank = divmod(rank, 2)
        assert info["shape"] == (2, 2) and info["names"] == ("dp", "pp")
        assert info["layout"] == [[0, 1], [2, 3]]  # global rank dp_rank * pp + pp_rank
        assert info["pp_is_mesh_group"] and info["dp_is_mesh_group"]
        assert info["pp_group_ranks"] == info["pp_ranks"] == [2 * dp_rank, 2 * dp_rank + 1]
        assert info["dp_group_ranks"] == info["dp_ranks"] == [pp_rank, pp_rank + 2]
        assert info["coordinate"] == (dp_rank, pp_rank) and (info["dp_rank"], info["pp_rank"]) == (dp_rank, pp_rank)
        # each group's collectives reach exactly its members (its timeout: tests/test_distributed_timeouts.py)
        assert info["sums"] == [float(4 * dp_rank + 1), float(2 * pp_rank + 2)], (rank, info["sums"])


def test_a_collective_returns_once_nothing_else_holds_its_tensors():
    """What a collective waits for before returning (Mesh.waiting_for's
    ``holding``): no other holder of its tensors, as gloo's worker thread is
    one until it drops its work. Here the other holder is a view dropped by
    a thread 50 ms later; a holder that never lets go is waited for only
    until the timeout."""
    import threading
    import time

    t = torch.zeros(())
    held = [t.view(())]
    threading.Timer(0.05, held.clear).start()
    start = time.monotonic()
    backend_threads.released_by_the_backend([t], timeout=5.0)
    assert t._use_count() == 1 and time.monotonic() - start >= 0.045
    kept = t.view(())
    start = time.monotonic()
    backend_threads.released_by_the_backend([t], timeout=0.1)
    assert 0.09 <= time.monotonic() - start < 2.0 and kept is not None
