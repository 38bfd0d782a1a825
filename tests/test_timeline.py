"""pipelstm/timeline.py on synthetic traces with answers worked out by hand,
independent of the engine: the idle spans and bubbles of ``bubbles``, the
Chrome trace JSON ``write_timeline`` writes, the Gantt chart with and
without matplotlib, and the empty trace. (The timeline of traces the engine
recorded: test_pipeline.py::test_timeline and
test_pipeline_recompute.py::test_distinct_phases_in_the_timeline.)
"""

import json
import sys

import pytest

from pipelstm.timeline import bubbles, write_timeline

T0 = 5_000_000_000  # a steady clock's ns, far from 0
US = 1000  # ns


def span(stage, phase, start_us, end_us, micro_batch=-1, chunk=-1):
    return dict(stage=stage, phase=phase, micro_batch=micro_batch, chunk=chunk, start_ns=T0 + start_us * US,
                end_ns=T0 + end_us * US)


def idle(stage, start_us, end_us):
    return span(stage, "idle", start_us, end_us)


# Two stages, one chunk, two micro-batches (GPipe), in µs:
#
#   forward pass, 0-30:              backward pass, 30-65:
#   stage 0 | F0 F1 tr .. |          | .. B1 B0 W |
#   stage 1 | .. F0 F1    |          | B1 B0 W .. |
#             0  10 20 25 30           30 40 50 55 60 65
#
# Idle, forward: stage 0 25-30 (its transfer 20-25 counts as busy), stage 1
# 0-10: 15 of 2 x 30 = 1/4. Backward: stage 0 30-40, stage 1 55-65: 20 of
# 2 x 35 = 2/7. Theoretical: (S-1)/(K*M+S-1) = 1/3.
GPIPE = [
    span(0, "forward", 0, 10, 0, 0), span(0, "forward", 10, 20, 1, 0), span(0, "transfer", 20, 25, 1, 0),
    span(1, "forward", 10, 20, 0, 0), span(1, "forward", 20, 30, 1, 0),
    span(1, "backward", 30, 40, 1, 0), span(1, "backward", 40, 50, 0, 0), span(1, "weights", 50, 55),
    span(0, "backward", 40, 50, 1, 0), span(0, "backward", 50, 60, 0, 0), span(0, "weights", 60, 65),
]
GPIPE_IDLE = [idle(0, 25, 30), idle(1, 0, 10), idle(0, 30, 40), idle(1, 55, 65)]
GPIPE_SUMMARY = dict(forward_bubble=1 / 4, forward_ms=0.030, backward_bubble=2 / 7, backward_ms=0.035,
                     theoretical_bubble=1 / 3)


def test_bubbles_of_a_two_stage_trace():
    spans, summary = bubbles(GPIPE, 2)
    assert spans == GPIPE_IDLE
    assert summary == pytest.approx(GPIPE_SUMMARY)


def test_overlapping_spans_are_busy_once():
    # Stage 0: a transfer inside a forward span, busy 0-10. Stage 1: a
    # transfer running past its forward span's end, busy 0-12 and 14-20.
    events = [span(0, "forward", 0, 10, 0, 0), span(0, "transfer", 2, 8, 0, 0),
              span(1, "forward", 0, 6, 0, 0), span(1, "transfer", 4, 12, 0, 0), span(1, "forward", 14, 20, 1, 0)]
    spans, summary = bubbles(events, 2)
    assert spans == [idle(0, 10, 20), idle(1, 12, 14)]
    assert summary["forward_bubble"] == pytest.approx((10 + 2) / 40)


def test_a_single_stage_has_no_bubble_and_recompute_starts_its_backward():
    # Back to back within each pass; the gap 12-20 lies between the passes.
    # The backward pass starts at the recompute span (were it counted in the
    # forward pass, that pass would run 0-25 with 8 µs idle).
    events = [span(0, "forward", 0, 10, 0, 0), span(0, "transfer", 10, 12, 0, 0),
              span(0, "recompute", 20, 25, 0, 0), span(0, "backward", 25, 35, 0, 0), span(0, "weights", 35, 40)]
    spans, summary = bubbles(events, 1)
    assert spans == []
    assert summary == pytest.approx(dict(forward_bubble=0.0, forward_ms=0.012, backward_bubble=0.0,
                                         backward_ms=0.020, theoretical_bubble=0.0))


def test_forward_only_trace_has_no_backward_summary():
    # A pass under no_grad; zero-length spans (a pass of length 0) give 0, not a division by zero.
    spans, summary = bubbles([span(0, "forward", 3, 3, 0, 0), span(1, "forward", 3, 3, 0, 0)], 2)
    assert spans == []
    assert summary == dict(forward_bubble=0.0, forward_ms=0.0, theoretical_bubble=1 / 2)


@pytest.mark.parametrize("S, K, M, expected", [(1, 4, 4, 0.0), (2, 1, 1, 1 / 2), (3, 2, 3, 2 / 8), (4, 3, 1, 3 / 6)])
def test_theoretical_bubble_counts_chunks_and_micro_batches_of_the_forward_spans(S, K, M, expected):
    events, t = [], 0
    for s in range(S):
        for m in range(M):
            for k in range(K):
                events.append(span(s, "forward", t, t + 1, m, k))
                t += 1
    events.append(span(0, "backward", t, t + 1, M, K))  # only forward spans count
    _, summary = bubbles(events, S)
    assert summary["theoretical_bubble"] == pytest.approx(expected)


def test_write_timeline_json(tmp_path):
    path = tmp_path / "trace.json"
    summary = write_timeline(GPIPE, ["stage 0 (cpu)", "stage 1 (cpu)"], str(path))
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    assert data["otherData"] == pytest.approx(GPIPE_SUMMARY)
    assert summary["json"] == str(path)
    assert {k: v for k, v in summary.items() if k not in ("json", "png")} == pytest.approx(GPIPE_SUMMARY)

    events = data["traceEvents"]
    assert events[:2] == [dict(name="thread_name", ph="M", pid=0, tid=s, args=dict(name=f"stage {s} (cpu)"))
                          for s in range(2)]
    # The spans, then the idle spans; times in µs from the first start.
    spans = events[2:]
    assert len(spans) == len(GPIPE) + len(GPIPE_IDLE)
    assert spans[0] == dict(name="forward m0 k0", cat="forward", ph="X", pid=0, tid=0, ts=0.0, dur=10.0,
                            args=dict(micro_batch=0, chunk=0))
    assert spans[2] == dict(name="transfer m1 k0", cat="transfer", ph="X", pid=0, tid=0, ts=20.0, dur=5.0,
                            args=dict(micro_batch=1, chunk=0))
    assert spans[7] == dict(name="weights", cat="weights", ph="X", pid=0, tid=1, ts=50.0, dur=5.0,
                            args=dict(micro_batch=-1, chunk=-1))
    for got, e in zip(spans, GPIPE + GPIPE_IDLE):
        assert got["ph"] == "X" and got["pid"] == 0
        assert got["cat"] == e["phase"] and got["tid"] == e["stage"]
        assert got["ts"] == (e["start_ns"] - T0) / US and got["dur"] == (e["end_ns"] - e["start_ns"]) / US
        assert got["args"] == dict(micro_batch=e["micro_batch"], chunk=e["chunk"])
    assert [s["name"] for s in spans[-4:]] == ["idle"] * 4


def test_write_timeline_png_with_and_without_matplotlib(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    summary = write_timeline(GPIPE, ["a", "b"], str(tmp_path / "with.json"))
    assert summary["png"] == str(tmp_path / "with.png")
    assert (tmp_path / "with.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.warns(UserWarning, match=r"no Gantt chart .*without\.png.*matplotlib is not installed"):
        summary = write_timeline(GPIPE, ["a", "b"], str(tmp_path / "without.json"))
    assert "png" not in summary
    assert (tmp_path / "without.json").exists() and not (tmp_path / "without.png").exists()


def test_an_empty_trace_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="nothing has run yet"):
        write_timeline([], ["stage 0"], str(tmp_path / "t.json"))
    assert not (tmp_path / "t.json").exists()
