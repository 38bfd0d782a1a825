"""A stopped peer (SIGSTOP) ends the run with an error naming what was awaited.

Two processes (pp=2, gloo, tests/scripts/stopped_peer.py) train a step, then
one stops itself at a chosen point; the other, waiting on it, must fail
within the mesh's timeout with an error naming its own stage, the operation,
the stage and rank it waited for and the timeout, and exit with code 1 (no
hang, no abort while its backend's thread still holds the collective). The
stopped process is killed in cleanup. A killed peer and the torchrun runs
are tests/test_distributed.py's.
"""

import re
import subprocess
import sys
import time

import pytest

from distributed_utils import ROOT, free_port, kill_tagged, launch, needs_gloo, new_tag

pytestmark = needs_gloo

SCRIPT = ROOT / "tests" / "scripts" / "stopped_peer.py"
TIMEOUT = 4.0  # the mesh's timeout (init_mesh(timeout=))
# Start-up (imports, the first step) on a busy 2-core machine, then the timeout.
BOUND = 60.0

CASES = {
    # the loss broadcast from the last stage (python/pipelstm/distributed/parallel.py)
    "loss-broadcast": (1, "loss-broadcast",
                       r"pipelstm\.distributed: stage 0 \(rank 0\) timed out after 4 s waiting for the loss "
                       r"broadcast from stage 1 \(rank 1\); is it alive\? \(.*Timed out"),
    # the gradient norm's all-reduce (python/pipelstm/distributed/clip.py)
    "clip": (1, "clip",
             r"pipelstm\.distributed: stage 0 \(rank 0\) timed out after 4 s waiting for the gradient norm "
             r"all-reduce with stage 1 \(rank 1\); is it alive\?"),
    # a point-to-point receive of the activations (csrc/pipeline/remote.cpp)
    "activations": (0, "step",
                    r"pipelstm\.Pipeline: stage 1 \(cpu, rank 1\), forward of micro-batch 0, chunk 0 failed: timed "
                    r"out after 4 s waiting for the activations of micro-batch 0, chunk 0 from stage 0 \(rank 0\); "
                    r"is it alive\?"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_stopped_peer_is_named_by_the_rank_waiting_on_it(case):
    stopped, point, pattern = CASES[case]
    tag, port = new_tag(), free_port()
    procs = []
    try:
        for rank in range(2):
            cmd = ["env", f"RANK={rank}", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}",
                   sys.executable, str(SCRIPT), "--stop", point, "--timeout", str(TIMEOUT),
                   "--stopped-rank", str(stopped)]
            procs.append(launch(cmd, tag))
        survivor = procs[1 - stopped]
        t0 = time.monotonic()
        try:
            out, _ = survivor.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank {1 - stopped} still running {BOUND} s after the start: it hangs on the stopped peer")
        elapsed = time.monotonic() - t0
    finally:
        kill_tagged(tag)
        for p in procs:
            p.kill()
            p.wait(30)
    assert "first step done" in out, out[-3000:]
    # An exit code of 1 and no abort after the message (a backend thread
    # freeing the collective's tensors while Python shuts down).
    assert "terminate called" not in out, out[-3000:]
    assert survivor.returncode == 1, out[-3000:]
    error = next((line for line in out.splitlines() if "error:" in line), "")
    assert re.search(pattern, error), out[-3000:]
    assert elapsed < BOUND
