"""pipelstm/distributed/mesh.py: which backend and device init_mesh picks
for the GPUs a machine has (the GPU counts are simulated: the rule is
checked here on any machine; tests/gpu/test_gpu_stack.py runs it on one)."""

import subprocess
import sys

import pytest
import torch

from distributed_utils import ROOT, TRAIN_LM, env
from pipelstm.distributed import mesh


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
