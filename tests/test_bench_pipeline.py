"""``bench pipeline`` and ``bench distributed``: medians of interleaved steps,
the equal-cores baseline beside the pipelines, busy times from the median
step itself, and per-process memory; the process groups behind them.
"""

import os
import subprocess
import sys

import pytest

from pipelstm.bench import baseline, report
from pipelstm.bench.groups import STEPS_PER_TURN, Group
from pipelstm.bench.pipeline import add_ratios, describe
from pipelstm.bench.pipelining_peer import SIZES

from distributed_utils import needs_gloo

pytestmark = needs_gloo


def _bench(tmp_path, name, *args):
    path = tmp_path / f"{name}.json"
    subprocess.run([sys.executable, "-m", "pipelstm.bench", name, "--quick", "--reps", "1", *args, "--json", str(path)],
                   check=True, capture_output=True, text=True, timeout=600)
    return report.read_json(str(path))


def test_group_steps_and_reports_memory():
    with Group("baseline", 1, baseline.setup, timeout=300, kind="nn.LSTM", quick=True, threads=1) as g:
        first, second = g.step(), g.step()
        assert first > 0 and second > 0
        (rank0,) = g.last
        assert rank0["peak_bytes"] >= rank0["start_bytes"] > 0


class _Counting:
    """A workload that counts its steps (info: how many so far)."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1

    def info(self) -> dict:
        return dict(steps=self.steps)


def _counting(rank, world):
    return _Counting()


def test_a_turn_is_steps_in_a_row_the_last_timed():
    assert STEPS_PER_TURN >= 2  # a training loop's step follows its own step
    with Group("counting", 1, _counting, timeout=300) as g:
        assert g.turn(3) > 0 and g.last[0]["steps"] == 3
        g.turn()
        assert g.last[0]["steps"] == 3 + STEPS_PER_TURN


def test_group_reports_a_failing_setup():
    with Group("bad", 1, baseline.setup, timeout=300, kind="no such LSTM", quick=True, threads=1) as g:
        with pytest.raises(RuntimeError, match="no such LSTM"):
            g.step()


def test_pipeline_quick(tmp_path):
    data = _bench(tmp_path, "pipeline", "--chunks", "4", "--micro-batches", "1", "--peer-micro-batches")
    rows = {r["config"]: r for r in data["rows"]}
    one = rows["pipelstm Pipeline, 1 stage x 1 thread"]
    (two,) = [r for r in data["rows"] if r.get("K") == 4]
    assert {"nn.LSTM model, 1 process x 2 threads (equal cores)",
            "pipelstm.LSTM model, 1 process x 2 threads (equal cores)"} <= set(rows)
    assert one["busy"][0] <= one["seconds"] * 1.02  # busy time from the same step
    assert len(two["busy"]) == 2 and max(two["busy"]) <= two["seconds"] * 1.02
    assert all(len(r["samples"]) == 1 for r in data["rows"])
    (memory,) = data["tables"]
    assert [len(m["stage_est"]) for m in memory["rows"]] == [1, 2]
    assert all(m["kept"] > 0 for m in memory["rows"])
    assert any("stands in for one device per stage" in n for n in data["notes"])


def test_distributed_quick(tmp_path):
    data = _bench(tmp_path, "distributed", "--chunks", "4", "--micro-batches", "1", "--peer-micro-batches", "2")
    rows = data["rows"]
    kinds = [r["kind"] for r in rows]
    assert kinds == ["pipelstm", "pipelstm", "baseline", "baseline", "peer", "peer"]
    one, pp2 = rows[0], rows[1]
    assert len(pp2["busy"]) == 2 and len(pp2["peak"]) == 2 and len(pp2["kept"]) == 2
    assert all(b <= pp2["seconds"] * 1.02 for b in pp2["busy"])
    assert all(len(r["peak"]) == (2 if r["kind"] != "baseline" and r is not one else 1) for r in rows)
    assert all(p > 0 for r in rows for p in r["peak"])
    assert data["tables"][0]["title"] == "Memory per process"


def _stored(name):
    return report.read_json(os.path.join(os.path.dirname(__file__), "..", "docs", "bench", f"{name}.json"))


@pytest.mark.parametrize("name", ["pipeline", "distributed", "distributed_quick"])
def test_ratios_reproduce_the_stored_results(name):
    data = _stored(name)
    rows = [{k: v for k, v in r.items() if k not in ("vs_one", "best_vs")} for r in data["rows"]]
    best = add_ratios(rows)
    fastest = min((r for r in data["rows"] if r["kind"] == "pipelstm" and r.get("K") is not None),
                  key=lambda r: r["seconds"])
    assert best["seconds"] == fastest["seconds"] and best["best_vs"] == 1.0
    for new, old in zip(rows, data["rows"]):
        assert new["vs_one"] == pytest.approx(old["vs_one"]) and new["best_vs"] == pytest.approx(old["best_vs"])


def test_ratios_without_a_pipelined_row_are_against_the_first():
    rows = [dict(kind="pipelstm", seconds=2.0), dict(kind="baseline", seconds=1.0), dict(kind="pipelstm", seconds=4.0)]
    assert add_ratios(rows) is None
    assert [(r["vs_one"], r["best_vs"]) for r in rows] == [(1.0, 1.0), (2.0, 0.5), (0.5, 2.0)]


@pytest.mark.parametrize("name, quick", [("pipeline", True), ("distributed", False), ("simulator", True),
                                         ("layout", True)])  # simulator and layout: always the quick size
def test_model_text_is_the_one_in_the_stored_notes(name, quick):
    assert _stored(name)["notes"][0].startswith(f"Model: {describe(SIZES[quick])}")
