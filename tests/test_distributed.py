"""Hybrid data + pipeline parallel training under torchrun (gloo, CPU).

Each test launches examples/train_lm.py with torchrun and compares what it
trained with the same training done in this process on the full batch with
torch's own nn.LSTM (tests/distributed_utils.py).
"""

import re
import time

import pytest
import torch

from distributed_utils import (SMALL, TORCHRUN, TRAIN_LM, kill_tagged, launch, max_difference, needs_gloo,
                               new_tag, reference_parameters, torchrun, two_agents, watch_run)

pytestmark = needs_gloo

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
    assert "Warning" not in result.stderr, result.stderr[-3000:]  # e.g. a deprecated DDP argument


def test_automatic_layout_matches_single_process(tmp_path, reference):
    # --pp auto: the simulator picks dp x pp, K and M on rank 0; every rank runs its plan
    result = torchrun(2, SMALL + ["--pp", "auto", "--max-steps", str(STEPS), "--save-model", str(tmp_path / "model.pt")])
    _check_trained(tmp_path, reference, result)
    assert "pipelstm.distributed: layout for 2 x cpu" in result.stdout and "predicted step" in result.stdout


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
#
# docs/distributed.md, "Faults": a killed (SIGKILL) or stopped (SIGSTOP) rank
# ends the run: its neighbour fails naming the stage it lost ("... from/to
# stage 1 (rank 1)"), at once for a dead peer and after --timeout for a
# stopped one, and exits non-zero within --timeout + 12 s; the agents end the
# rest. Checked here with one torchrun agent and with two, from the moment
# rank 1 kills or stops itself: rank 0 names stage 1 (rank 1) and has exited
# within --timeout + 12 s; every worker and every agent exits non-zero; every
# process of the run has ended within --timeout + 12 s, except that one agent
# whose other worker failed ends a stopped worker only 30 s later (below).

TIMEOUT = 8.0  # --timeout of the fault runs
SLACK = 12.0   # the documented bound is --timeout + 12 s: teardown on a busy 2-core machine
# How often the agents poll their workers. With one agent, a killed rank's
# death is seen at once both by rank 0 (its connection closes) and by the
# agent (its child exits): rank 0 names the dead stage within tens of ms,
# but if the agent polls in that window it ends rank 0 first (SIGTERM) and
# nothing names the stage; polling every 8 s makes that unlikely (< 1 %).
# Otherwise rank 0 reports before anything ends it, and the agents may poll
# often.
MONITOR = {("kill", 1): 8.0, ("kill", 2): 0.5, ("stop", 1): 0.5, ("stop", 2): 0.5}
# A stopped worker ignores the SIGTERM its agent sends when it ends the rest;
# the agent SIGKILLs it after a grace period. When the agent's rendezvous
# fails (two agents: rank 0's agent exits and takes the store with it) that
# is --shutdown-timeout; when another of its own workers failed (one agent)
# torch 2.13's agent waits a fixed 30 s (LocalElasticAgent._stop_workers
# calls _shutdown() with its default), which no option shortens. (Were the
# stopped rank's agent the store's host, it would never learn that the run
# failed: two_agents() makes rank 0's agent the host.)
SHUTDOWN = 1
STOPPED_WORKER_GRACE = 30.0
RANK0_ERROR = (r"pipelstm\.Pipeline: stage 0 \(cpu, rank 0\) (failed|timed out after \S+ s) \w+ the \w+ of "
               r"micro-batch \d+, chunk \d+ (from|to) stage 1 \(rank 1\)")


def _fault_args(kind: str, rank: int, step: int):
    return SMALL + ["--pp", "2", "--max-steps", "20", "--timeout", str(TIMEOUT),
                    "--inject-fault", f"{kind}:{rank}:{step}"]


@pytest.mark.parametrize("agents", [1, 2], ids=["one-agent", "two-agents"])
@pytest.mark.parametrize("kind", ["kill", "stop"])
def test_dead_or_stopped_rank_ends_the_run(kind, agents):
    tag = new_tag()
    options = [f"--monitor-interval={MONITOR[kind, agents]}", f"--shutdown-timeout={SHUTDOWN}"]
    if agents == 1:
        procs = [launch(TORCHRUN + ["--standalone", "--nproc-per-node=2", *options, str(TRAIN_LM)]
                        + _fault_args(kind, 1, 3), tag)]
    else:
        procs = two_agents(_fault_args(kind, 1, 3), tag=tag, options=options)
    bound = TIMEOUT + SLACK + (STOPPED_WORKER_GRACE if (kind, agents) == ("stop", 1) else 0)
    within = bound + 10
    try:
        run = watch_run(procs, tag, after="injected fault", within=within)
    finally:
        kill_tagged(tag)
    text = run.text()[-4000:]
    fault = run.first(r"\[rank 1\] injected fault")
    assert fault is not None, ("rank 1 did not get to its fault", text)
    t_fault = fault[0]

    # Rank 0 names the stage it lost: a dead peer at once, a stopped one after --timeout.
    error = run.first(RANK0_ERROR)
    if error is None and (kind, agents) == ("kill", 1):
        # The race docs/distributed.md documents: the one agent saw rank 1
        # die and ended rank 0 (SIGTERM) before it printed; the agent's
        # report then names the dead rank as the root cause.
        root = re.search(r"Root Cause \(first observed failure\):\s*\[\d+\]:(?:(?!\n\[\d+\]:).)*?"
                         r"rank\s*: 1 \(local_rank: 1\)\s*exitcode\s*: -9 ", run.text(), re.S)
        assert root is not None, ("neither rank 0 nor the agent named rank 1", text)
        error = (t_fault, "failed: the agent's report")
    assert error is not None, ("no error of rank 0 naming stage 1 (rank 1)", text)
    t_error, line = error
    if kind == "kill":
        assert "failed" in line and t_error - t_fault < TIMEOUT - 1, (t_error - t_fault, line)
    else:
        assert f"timed out after {TIMEOUT:g} s" in line and "is it alive?" in line, line
        assert t_error - t_fault >= TIMEOUT - 1, (t_error - t_fault, line)

    # Rank 0 has exited within --timeout + 12 s, non-zero as its agent reports
    # it; rank 1 was SIGKILLed (by itself, or stopped, by its agent).
    assert sorted(run.workers.values()) == [0, 1], run.workers
    codes = run.exit_codes()
    for pid, rank in run.workers.items():
        if rank == 0:
            ended = run.gone[pid] - t_fault if pid in run.gone else None
            assert ended is not None and ended <= TIMEOUT + SLACK, ("rank 0 ended after", ended, text)
            assert codes.get(pid, 0) != 0, ("rank 0's exit code", codes.get(pid), text)
        else:
            assert codes.get(pid, -9) == -9, ("rank 1's exit code", codes.get(pid), text)
    # Every agent exits non-zero.
    assert all(rc is not None and rc != 0 for rc in run.returncodes), (run.returncodes, text)
    # Every process of the run has ended in time.
    assert run.end is not None, ("still running", within, "s after the fault", text)
    assert run.end - t_fault <= bound, (run.end - t_fault, bound, text)


# --- checkpoints ------------------------------------------------------------------------


def test_resume_after_killed_rank_loses_nothing(tmp_path):
    # Every kind of mask a pipeline draws: element dropout (after the LSTM),
    # variational dropout between its layers, DropConnect on its weights,
    # zoneout in its layers.
    args = SMALL + ["--pp", "2", "--max-steps", "6", "--checkpoint-every", "2", "--dropout", "0.2",
                    "--dropout-mode", "variational", "--weight-dropout", "0.3", "--zoneout", "0.1"]
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
    from distributed_utils import ROOT

    t0 = time.monotonic()
    # The last rank starts 3 s late: the others must wait for it to say why too.
    result = torchrun(nproc, SMALL + args + ["--max-steps", "2", "--timeout", "20"],
                      script=ROOT / "tests" / "scripts" / "late_rank.py")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert message in out, out[-3000:]
    assert out.count(message) >= nproc  # every rank says why
    assert time.monotonic() - t0 < 60


def _regularised_reference(kind, x, y, K, M, seed):
    """(unsplit model, its loss) of regularised_stages.py's step, computed in
    plain torch with the masks a pass in one process draws after ``seed``."""
    import copy

    import pipelstm
    from pipeline_masks import pipeline_masks, run_masked
    from pipelstm import _C
    from test_locked_dropout import _variational_model
    from test_pipeline_zoneout import H, L, _item_masks, _model, _reference

    T, B = x.shape
    if kind == "weight":  # nn.LSTM with each weight_hh times the mask its unit drew from the pass seed
        from pipeline_models import weight_dropped_model
        from pipelstm.regularisation import unit_seed, weight_mask

        torch.manual_seed(1)
        model = weight_dropped_model()
        emb, lstm, dec = model
        torch.manual_seed(seed)
        pass_seed = _C.pipeline.draw_pass_seed()
        ref = torch.nn.LSTM(lstm.input_size, lstm.hidden_size, lstm.num_layers).double()
        weights = dict(lstm.named_parameters())
        for layer in range(lstm.num_layers):  # global units 1 and 2
            w = weights[f"weight_hh_l{layer}"]
            weights[f"weight_hh_l{layer}"] = w * weight_mask(w, 0.3, unit_seed(pass_seed, 1 + layer))
        out, _ = torch.func.functional_call(ref, weights, (emb(x),))
        logits = dec(out)
    elif kind == "zoneout":  # each sequence alone, step by step (tests/test_pipeline_zoneout.py)
        model = _model("lstm")
        emb, lstm, dec = model
        torch.manual_seed(seed)
        masks = _item_masks(_C.pipeline.draw_pass_seed(), 1, [T] * B, K, M)
        zeros = torch.zeros(L, B, H, dtype=torch.float64)
        sequences, _, _ = _reference("lstm", lstm, emb(x), [T] * B, zeros, zeros, masks)
        logits = torch.stack([dec(s) for s in sequences], 1)
    else:  # every dropout the product with its mask, layer by layer (tests/pipeline_masks.py)
        torch.manual_seed(1)
        model = _variational_model()
        probe = pipelstm.Pipeline(copy.deepcopy(model), devices=["cpu"], chunks=K, micro_batches=M, threads=1)
        zeros = torch.zeros(2, B, 8, dtype=torch.float64)
        logits, _ = run_masked(model, x, (zeros, zeros), pipeline_masks(probe.core, x, seed))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    return model, loss.detach()


@pytest.mark.parametrize("kind", ["zoneout", "variational", "weight"])
def test_regularised_stages_match_the_float64_reference_with_their_masks(tmp_path, kind):
    # Two processes, a stage each, the LSTM's layers one in each: the loss
    # and every gradient of a training step equal a float64 reference in
    # plain torch run with the masks the pass drew, which are those of a
    # pass in one process after the seed every rank was given (a unit's
    # masks follow its place in the whole model).
    from distributed_utils import ROOT
    from test_pipeline_zoneout import SEED

    T, B, K, M = 7, 4, 3, 2
    result = torchrun(2, [str(tmp_path), kind, str(T), str(B), str(K), str(M)],
                      script=ROOT / "tests" / "scripts" / "regularised_stages.py", timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    model, loss = _regularised_reference(kind, ranks[0]["x"], ranks[0]["y"], K, M, SEED)
    tol = dict(rtol=1e-10, atol=1e-10)
    for r in ranks:
        torch.testing.assert_close(r["loss"], loss, **tol)
    grads = {**ranks[0]["grads"], **ranks[1]["grads"]}
    assert set(grads) == {name for name, _ in model.named_parameters()}
    assert "1.weight_hh_l0" in ranks[0]["grads"] or "2.weight_hh_l0" in ranks[0]["grads"]  # layer 0 on rank 0
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **tol, msg=lambda m: f"{name}: {m}")


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
