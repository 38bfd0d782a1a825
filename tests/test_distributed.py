"""Hybrid data + pipeline parallel training under torchrun (gloo, CPU).

Each test launches examples/train_lm.py with torchrun and compares what it
trained with the same training done in this process on the full batch with
torch's own nn.LSTM (tests/distributed_utils.py).
"""

import time

import pytest
import torch
import torch.distributed as dist

from distributed_utils import (SMALL, TORCHRUN, TRAIN_LM, kill_tagged, launch, max_difference, new_tag,
                               reference_parameters, torchrun, two_agents, watch)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

STEPS = 5


@pytest.fixture(scope="module")
def reference():
    return reference_parameters(STEPS, SMALL)


def _check_trained(tmp_path, reference, result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trained = torch.load(tmp_path / "model.pt")
    assert max_difference(trained, reference) <= 1e-5


@pytest.mark.parametrize("nproc,pp,extra", [(2, 2, []), (2, 2, ["--loss-outside"]), (2, 1, []), (4, 2, [])],
                         ids=["pp2", "pp2-loss-outside", "dp2", "dp2xpp2"])
def test_matches_single_process(tmp_path, reference, nproc, pp, extra):
    # the loss inside the last stage (PipelineParallel(loss_fn=...)), or from its logits
    result = torchrun(nproc, SMALL + extra + ["--pp", str(pp), "--max-steps", str(STEPS), "--save-model",
                                              str(tmp_path / "model.pt")])
    _check_trained(tmp_path, reference, result)
    assert f"pp={pp} x dp={nproc // pp}" in result.stdout


def test_two_agents_match_single_process(tmp_path, reference):
    procs = two_agents(SMALL + ["--pp", "2", "--max-steps", str(STEPS), "--save-model", str(tmp_path / "model.pt")])
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        outs.append(out)
        assert p.returncode == 0, out[-4000:]
    trained = torch.load(tmp_path / "model.pt")
    assert max_difference(trained, reference) <= 1e-5


# --- faults -----------------------------------------------------------------------------

TIMEOUT = 8.0  # --timeout of the fault runs
SLACK = 12.0   # process start-up is excluded; this covers teardown on a busy 2-core machine


def _fault_args(kind: str, rank: int, step: int):
    return SMALL + ["--pp", "2", "--max-steps", "20", "--timeout", str(TIMEOUT),
                    "--inject-fault", f"{kind}:{rank}:{step}"]


def _fault_time(lines):
    return next(t for t, line in lines if "injected fault" in line)


@pytest.mark.parametrize("kind", ["kill", "stop"])
def test_dead_or_stopped_rank_ends_the_run(kind):
    tag = new_tag()
    cmd = TORCHRUN + ["--standalone", "--nproc-per-node=2", "--monitor-interval=0.2", str(TRAIN_LM)]
    proc = launch(cmd + _fault_args(kind, 1, 3), tag)
    try:
        lines, rc = watch(proc, 120)
    finally:
        kill_tagged(tag)
    text = "".join(line for _, line in lines)
    assert rc is not None and rc != 0, text[-3000:]
    t_fault = _fault_time(lines)
    # rank 0 names the stage it waited for: a stopped peer after --timeout,
    # a dead one at once (or the agent, which saw the death, ends rank 0 first)
    errors = [t for t, line in lines if "from stage 1 (rank 1)" in line or "to stage 1 (rank 1)" in line]
    if kind == "stop":
        assert errors and "timed out" in text and "is it alive" in text, text[-3000:]
        assert TIMEOUT - 1 <= errors[0] - t_fault <= TIMEOUT + SLACK, text[-3000:]
    else:
        assert max(t for t, _ in lines) - t_fault <= TIMEOUT + SLACK, text[-3000:]


@pytest.mark.parametrize("kind", ["kill", "stop"])
def test_faults_across_two_agents(kind):
    tag = new_tag()
    procs = two_agents(_fault_args(kind, 1, 3), tag=tag)
    try:
        lines0, rc0 = watch(procs[0], 120)  # the agent of rank 0, which survives
    finally:
        kill_tagged(tag)
    out1 = procs[1].communicate()[0]
    text0 = "".join(line for _, line in lines0)
    assert rc0 is not None and rc0 != 0, text0[-3000:]
    assert "injected fault" in out1
    # rank 0 names the stage it waited for
    errors = [t for t, line in lines0 if "stage 1 (rank 1)" in line and "pipelstm.Pipeline" in line]
    assert errors, text0[-3000:]
    last_step = max(t for t, line in lines0 if "| loss" in line)
    assert errors[0] - last_step <= TIMEOUT + SLACK, text0[-3000:]
    if kind == "stop":
        assert "timed out" in text0


# --- checkpoints ------------------------------------------------------------------------


def test_resume_after_killed_rank_loses_nothing(tmp_path):
    args = SMALL + ["--pp", "2", "--max-steps", "6", "--checkpoint-every", "2", "--dropout", "0.2"]
    whole = torchrun(2, args + ["--checkpoint-dir", str(tmp_path / "a"), "--save-model", str(tmp_path / "a.pt")])
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    resumed = torchrun(2, args + ["--checkpoint-dir", str(tmp_path / "b"), "--save-model", str(tmp_path / "b.pt"),
                                  "--resume", "--inject-fault", "kill:1:5"], extra=["--max-restarts=1"])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "injected fault" in resumed.stdout and "resumed from" in resumed.stdout
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # dropout masks included: the RNG state is restored too

    # The consolidated checkpoint loads into the unsplit model, its LSTM part into nn.LSTM.
    from distributed_utils import TRAIN_LM
    import sys

    sys.path.insert(0, str(TRAIN_LM.parent))
    import train_lm

    sys.path.pop(0)
    latest = (tmp_path / "b" / "latest").read_text().strip()
    full = torch.load(tmp_path / "b" / latest / "model.pt")
    model = train_lm.build_model(full["0.weight"].shape[0], 16, 32, 2, 0.0, 0)
    model.load_state_dict(full, strict=True)
    lstm = torch.nn.LSTM(16, 32, 2)
    lstm.load_state_dict({k[2:]: v for k, v in full.items() if k.startswith("1.")}, strict=True)


# --- bad configurations ------------------------------------------------------------------


@pytest.mark.parametrize("nproc,args,message", [
    (3, ["--pp", "2"], "world size 3 is not divisible by pp=2"),
    (3, ["--pp", "3"], "--pp 3 is larger than the number of LSTM layers (2)"),
], ids=["world-not-divisible", "pp-larger-than-layers"])
def test_bad_configuration_stops_every_rank(nproc, args, message):
    t0 = time.monotonic()
    result = torchrun(nproc, SMALL + args + ["--max-steps", "2", "--timeout", "20"])
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert message in out, out[-3000:]
    assert out.count(message) >= nproc  # every rank says why
    assert time.monotonic() - t0 < 60


def test_mismatched_models_stop_every_rank():
    import subprocess

    from distributed_utils import ROOT, env

    script = ROOT / "tests" / "scripts" / "mismatched_model.py"
    result = subprocess.run(TORCHRUN + ["--standalone", "--nproc-per-node=2", str(script)], capture_output=True,
                            text=True, timeout=120, env=env(), cwd=ROOT)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "constructed" not in out
    assert out.count("rank 1's model differs from rank 0's") >= 2, out[-3000:]


def test_atomic_save_keeps_the_last_good_file(tmp_path, monkeypatch):
    from pipelstm.distributed import atomic_save

    path = tmp_path / "ckpt.pt"
    atomic_save({"step": 1}, str(path))

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="simulated"):
        atomic_save({"step": 2}, str(path))
    monkeypatch.undo()
    assert torch.load(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left behind
