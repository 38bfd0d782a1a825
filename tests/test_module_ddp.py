"""pipelstm.LSTM wrapped in DistributedDataParallel (one process, gloo): it
trains like the bare module. (pipelstm's own multi-process pipeline:
test_distributed.py.)

The run is a child process with a time limit: on a loaded machine, torch's
gloo process group can deadlock in ``destroy_process_group`` (its worker
thread waits for the GIL the main thread holds while joining it; seen once
in this test, after the comparison had passed). A hang before the
comparison fails the test; one in that shutdown, after it, is reported as a
warning rather than left to stall the suite.
"""

import copy
import os
import subprocess
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn

from lstm_pairs import pair, weighted_loss
from reference import rel_error

COMPARED = "compared: the DDP-wrapped module trains like the bare one"


def _train_and_compare(store_path: str) -> None:
    _, ours = pair()
    bare = copy.deepcopy(ours)
    store = dist.FileStore(store_path, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(ours)
        x = torch.randn(5, 2, 4)
        for model in (ddp, bare):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            out, (h, c) = model(x)
            weighted_loss(out, h, c).backward()
            if model is ddp:
                grads = [p.grad.clone() for p in ddp.module.parameters()]
            opt.step()
        for g, p in zip(grads, bare.parameters()):
            assert rel_error(g, p.grad) <= 1e-6
        for p, p_bare in zip(ddp.module.parameters(), bare.parameters()):
            assert rel_error(p, p_bare) <= 1e-6
        print(COMPARED, flush=True)
    finally:
        dist.destroy_process_group()


def test_ddp_single_process_gloo_trains_like_the_bare_module(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import test_module_ddp as t; t._train_and_compare({str(tmp_path / 'store')!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True,
                              timeout=240)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        assert COMPARED in out, f"the DDP run hung before its comparison:\n{out}"
        warnings.warn("the DDP run compared correctly, then hung in torch's gloo destroy_process_group")
        return
    assert done.returncode == 0, done.stdout + done.stderr
    assert COMPARED in done.stdout
