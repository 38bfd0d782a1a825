"""pipelstm/bench/layout.py's plan: the automatic choice over the three
kinds of layout this machine runs takes the plan's margin once, from the
fastest layout predicted of any kind, as one search over them all would."""

from types import SimpleNamespace

import pytest

from pipelstm.bench import layout as bench
from pipelstm.simulator.layout import PLAN_MARGIN, LayoutChoice
from pipelstm.simulator.model import Layout


def _layout(dp, pp, K, M, in_process):
    return Layout(dp=dp, pp=pp, balance=[1] * pp, chunks=K, micro_batches=M, in_process=in_process)


# (costs, pp, in_process) of each kind's search -> {margin: (layout, predicted seconds)}
PLANS = {
    # dp=2: fastest at K=4 x M=2; its simplest within the margin, K = M = 1, is 9 % slower
    ("one", None, False): {0.0: (_layout(2, 1, 4, 2, False), 0.100), PLAN_MARGIN: (_layout(2, 1, 1, 1, False), 0.109)},
    # 1 stage x 2 threads: 12 % slower than the fastest of any kind, but 2.8 % of the dp=2 kind's simplest
    ("two", None, True): {0.0: (_layout(1, 1, 1, 1, True), 0.112), PLAN_MARGIN: (_layout(1, 1, 1, 1, True), 0.112)},
    ("one", 2, True): {0.0: (_layout(1, 2, 4, 1, True), 0.130), PLAN_MARGIN: (_layout(1, 2, 4, 1, True), 0.130)},
}


@pytest.fixture
def fake_search(monkeypatch):
    monkeypatch.setattr(bench, "calibrations", lambda model, loss, sizes: ("one", "two"))
    monkeypatch.setattr(bench, "search_sizes", lambda T, B, n: [])
    monkeypatch.setattr(bench, "machine", lambda processes, measured: f"{processes} processes")

    def choose_layout(costs, cluster, T, B, pp=None, in_process=False, margin=0.0):
        layout, step = PLANS[(costs, pp, in_process)][margin]
        return LayoutChoice(layout, SimpleNamespace(step_s=step), why=f"{costs} pp={pp} margin={margin}")

    monkeypatch.setattr(bench, "choose_layout", choose_layout)


def test_the_margin_is_taken_once_from_the_fastest_of_any_kind(fake_search):
    (kind, pp, dp, threads, plan), extra = bench.plan(model=None, T=8, B=4, measured=None)
    # Not the 1-stage pipeline on 2 threads: 12 % over the fastest predicted
    # layout (dp=2 at K=4 x M=2), though within the margin of the dp=2
    # kind's simplest choice, against which a per-kind margin measured it.
    assert (kind, pp, dp, threads) == ("parallel", 1, 2, 1)
    assert (plan.layout.chunks, plan.layout.micro_batches) == (1, 1)  # the simpler of the two dp=2 layouts
    assert [p.prediction.step_s for _, _, p in extra["candidates"]] == [0.109, 0.130, 0.112]


def test_the_two_calibrations_take_turns_round_by_round(monkeypatch):
    """A slow spell of the machine falls on both alike: the 1-thread and the
    2-thread calibration alternate, not one after the other."""
    rounds = []

    class Calibrator:
        def __init__(self, model, loss_fn, threads, sizes):
            self.threads = threads

        def round(self):
            rounds.append(self.threads)

        def costs(self):
            return f"{self.threads} thread(s)"

    monkeypatch.setattr(bench.sim, "Calibrator", Calibrator)
    assert bench.calibrations(None, None, []) == ("1 thread(s)", "2 thread(s)")
    assert rounds == [1, 2] * bench.CALIBRATION_ROUNDS
