"""Calibration of the pipeline simulator: the units measured on the engine,
their bytes from the real tensors, the fit, and the JSON round trip."""

import importlib
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.simulator import Calibrator, Cluster, FittedCosts, Layout, Link, calibrate, predict
from pipelstm.simulator.costs import fit_bytes, fit_seconds

SIZES = [(2, 1), (4, 2), (8, 2), (4, 4)]


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(30, 8), pipelstm.LSTM(8, 16, num_layers=2), nn.Linear(16, 30))


@pytest.fixture(scope="module")
def costs():
    return calibrate(tiny(), loss_fn=nn.CrossEntropyLoss(), sizes=SIZES, repeats=1)


def test_units_and_bytes_come_from_the_real_model(costs):
    units = costs.units()
    assert [u.kind for u in units] == ["embedding", "lstm", "lstm", "linear", "cross_entropy"]
    assert [u.param_bytes for u in units] == [30 * 8 * 4, 4 * 16 * (8 + 16 + 2) * 4, 4 * 16 * (16 + 16 + 2) * 4,
                                              (16 * 30 + 30) * 4, 0]
    assert [costs.output_bytes(u, 3, 5) for u in range(4)] == [8 * 4 * 15, 16 * 4 * 15, 16 * 4 * 15, 30 * 4 * 15]
    assert units[1].state_bytes_per_row == (16 + 16) * 4


def test_saved_bytes_predict_what_the_engine_keeps_at_an_unmeasured_size(costs):
    model = tiny()
    pipe = pipelstm.Pipeline(model, ["cpu"], threads=1, loss_fn=nn.CrossEntropyLoss())
    T, B = 6, 3  # not among SIZES
    loss, _ = pipe(torch.randint(0, 30, (T, B)), target=torch.randint(0, 30, (T, B)))
    predicted = sum(costs.saved_bytes(u, T, B) for u in range(len(costs.units())))
    assert predicted == pytest.approx(pipe.saved_activation_bytes, rel=0.02)


def test_every_phase_is_measured_and_positive(costs):
    for u, info in enumerate(costs.units()):
        for phase in ("forward", "backward"):
            if info.kind != "cross_entropy":  # the loss: a difference of two runs, may be 0
                assert costs.seconds(u, phase, 4, 2) > 0
        assert (costs.seconds(u, "weights", 8, 2) > 0) == (info.param_bytes > 0)


def test_a_calibration_round_trips_through_json(costs, tmp_path):
    path = tmp_path / "calibration.json"
    costs.save(str(path))
    loaded = FittedCosts.load(str(path))
    assert loaded.to_dict() == json.loads(path.read_text())
    assert loaded.to_dict() == costs.to_dict()
    cluster = Cluster(1, 2, "cpu", 1e9, Link(0, float("inf")), Link(1e-4, 1e9), Link(1e-4, 1e9))
    layout = Layout(1, 2, [2, 3], 2, 2)
    for T, B in ((8, 2), (12, 5)):  # measured sizes and fitted ones
        a, b = predict(costs, layout, cluster, T, B), predict(loaded, layout, cluster, T, B)
        assert (a.step_s, a.stage_peak_bytes, a.events) == (b.step_s, b.stage_peak_bytes, b.events)


def test_the_fit_recovers_its_model():
    truth = (2e-4, 3e-5, 1e-6)
    samples = [(t, b, truth[0] + truth[1] * t + truth[2] * t * b) for t, b in [(1, 1), (8, 2), (16, 16), (64, 4)]]
    coef, worst = fit_seconds(samples)
    assert coef == pytest.approx(truth, rel=1e-6)
    assert worst < 1e-9
    coef, worst = fit_bytes([(t, b, 64 * b + 96 * t * b) for t, b in [(1, 1), (8, 2), (3, 5)]])
    assert coef == pytest.approx([0, 64, 96], abs=1e-6)
    # never negative, even where the best unconstrained fit would be
    coef, _ = fit_seconds([(1, 1, 1.0), (2, 1, 0.5), (4, 1, 0.4)])
    assert min(coef) >= 0


def test_a_size_that_was_measured_is_used_as_measured(costs):
    fit = costs.fits[1]
    assert costs.seconds(1, "forward", 8, 2) == fit.measured["8,2"]["forward"]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(sizes=[(2, 1), (4, 2)]), ValueError, "sizes must be at least 3"),
    (dict(sizes=[(2, 1), (4, 0), (8, 2)]), ValueError, "sizes must be"),
    (dict(threads=0), ValueError, "threads must be a positive int"),
    (dict(repeats=0), ValueError, "repeats must be a positive int"),
    (dict(loss_fn=nn.MSELoss()), ValueError, "loss_fn must be an nn.CrossEntropyLoss"),
])
def test_bad_calibration_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        calibrate(tiny(), **kwargs)


def test_bad_models_and_files_are_named(tmp_path):
    with pytest.raises(TypeError, match="model must be an nn.Sequential"):
        calibrate(pipelstm.LSTM(8, 16))
    with pytest.raises(ValueError, match="expected a calibration of format"):
        FittedCosts.from_dict({"format": "something else"})
    with pytest.raises(RuntimeError, match="round"):
        Calibrator(tiny(), sizes=SIZES).costs()


def test_each_size_is_timed_in_its_second_step_in_a_row(monkeypatch):
    """A training loop runs one size step after step: the timed step follows
    an untimed one of the same size, not another size's."""
    calib = importlib.import_module("pipelstm.simulator.calibrate")
    calibrator = Calibrator(tiny(), loss_fn=nn.CrossEntropyLoss(), sizes=SIZES)
    runs = []
    real = calib._run

    def recording(core, x, target):
        runs.append((tuple(x.shape), torch.autograd.profiler._is_profiler_enabled))
        return real(core, x, target)

    monkeypatch.setattr(calib, "_run", recording)
    calibrator.round()
    timed = [i for i, (_, profiled) in enumerate(runs) if profiled]
    assert [runs[i][0] for i in timed] == [tuple(s) for s in SIZES]
    assert all(i > 0 and runs[i - 1] == (runs[i][0], False) for i in timed)


def test_scaled_costs_are_slower_by_the_factor(costs):
    slow = costs.scaled(2.5, device="slower cpu")
    assert slow.device == "slower cpu"
    for u in range(len(costs.units())):
        for phase, (t, b) in (("forward", (8, 2)), ("backward", (12, 5)), ("weights", (4, 4))):
            assert slow.seconds(u, phase, t, b) == pytest.approx(2.5 * costs.seconds(u, phase, t, b))
        assert slow.saved_bytes(u, 8, 2) == costs.saved_bytes(u, 8, 2)
    with pytest.raises(ValueError, match="factor must be a positive number"):
        costs.scaled(0)


def test_a_unit_takes_its_kernels_time_where_it_is_longer_than_its_launches():
    """On CUDA a unit's range ends once its kernels are launched: where they
    run longer on the device, that is the unit's time."""
    from types import SimpleNamespace

    calib = importlib.import_module("pipelstm.simulator.calibrate")

    def event(name, host_us, device_us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=10, end=10 + host_us),
                               device_time_total=device_us)

    got = calib._unit_seconds([
        event("pipelstm forward stage 0 unit 1 'l0' (LSTM layer) micro-batch 0 chunk 0", 100, 250),
        event("pipelstm forward stage 0 unit 1 'l0' (LSTM layer) micro-batch 0 chunk 1", 300, 250),
        event("pipelstm backward stage 0 unit 2 'fc' (Linear) micro-batch 0 chunk 0", 40, 0),  # the CPU: none
        event("pipelstm forward stage 0", 1000, 1000),  # a pass, not a unit
    ])
    assert got == {(1, "forward"): pytest.approx(550e-6), (2, "backward"): pytest.approx(40e-6)}


def test_a_calibration_writes_nothing_to_stderr():
    # torch's profiler writes a line at each start and stop; a job's
    # `--pp auto` printed over a hundred of them before its first step.
    code = ("import torch; from torch import nn; import pipelstm; from pipelstm.simulator import calibrate; "
            "calibrate(nn.Sequential(nn.Embedding(30, 8), pipelstm.LSTM(8, 16), nn.Linear(16, 30)), "
            "loss_fn=nn.CrossEntropyLoss(), sizes=[(2, 1), (4, 2), (8, 2)], repeats=1); print('calibrated')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "calibrated" in run.stdout, run.stderr[-2000:]
    assert "profiler_start" not in run.stderr and "profiler_stop" not in run.stderr, run.stderr[-2000:]
