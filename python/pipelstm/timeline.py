"""The schedule that ran, as a Chrome trace and a Gantt chart.

Used by ``Pipeline.timeline`` (stages in one process) and
``pipelstm.distributed.PipelineParallel.timeline`` (stages gathered from
several processes). An event is a dict with ``stage``, ``phase``
("forward", "recompute", "backward", "weights" (a unit's parameter gradients,
micro-batch and chunk -1), "transfer"), ``micro_batch``, ``chunk``,
``start_ns`` and ``end_ns`` (steady clock).
"""

import json
import os
import warnings
from typing import Dict, List, Sequence

__all__ = ["write_timeline", "bubbles"]

_COLORS = {"forward": "#4c72b0", "recompute": "#8172b3", "backward": "#dd8452", "weights": "#c44e52",
           "transfer": "#55a868", "idle": "#e5e5e5"}


def bubbles(events: List[dict], num_stages: int):
    """The idle spans of each pass and the summary: per pass, the idle
    fraction of the stages between the pass's first start and last end, its
    length, and the theoretical bubble (S-1)/(K*M+S-1)."""
    idle_spans, summary = [], {}
    # A stage's backward pass: from its first recompute or backward span on
    # (so each transfer falls in its pass; per stage, as stages gathered
    # from several machines have clocks of their own).
    backward_start = {}
    for e in events:
        if e["phase"] in ("backward", "recompute"):
            backward_start[e["stage"]] = min(backward_start.get(e["stage"], e["start_ns"]), e["start_ns"])

    def in_backward(e):
        return e["start_ns"] >= backward_start.get(e["stage"], float("inf"))

    for group_name in ("forward", "backward"):
        group = [e for e in events if in_backward(e) == (group_name == "backward")]
        if not group:
            continue
        lo, hi = min(e["start_ns"] for e in group), max(e["end_ns"] for e in group)
        idle_total = 0
        for s in range(num_stages):
            mine = sorted((e for e in group if e["stage"] == s), key=lambda e: e["start_ns"])
            cursor = lo
            for e in mine + [dict(start_ns=hi, end_ns=hi)]:
                if e["start_ns"] > cursor:
                    idle_spans.append(dict(stage=s, phase="idle", micro_batch=-1, chunk=-1, start_ns=cursor,
                                           end_ns=e["start_ns"]))
                    idle_total += e["start_ns"] - cursor
                cursor = max(cursor, e["end_ns"])
        summary[f"{group_name}_bubble"] = idle_total / (num_stages * (hi - lo)) if hi > lo else 0.0
        summary[f"{group_name}_ms"] = (hi - lo) / 1e6
    forward = [e for e in events if e["phase"] == "forward"]
    K = 1 + max((e["chunk"] for e in forward), default=0)
    M = 1 + max((e["micro_batch"] for e in forward), default=0)
    summary["theoretical_bubble"] = (num_stages - 1) / (K * M + num_stages - 1)
    return idle_spans, summary


def write_timeline(events: List[dict], stage_names: Sequence[str], path: str) -> Dict[str, object]:
    """Writes ``path`` (Chrome trace JSON; open it in chrome://tracing or
    ui.perfetto.dev) and, if matplotlib is installed, a Gantt chart next to
    it (same name, ``.png``; without matplotlib a warning says so). Returns
    the paths and the bubbles."""
    if not events:
        raise RuntimeError("timeline: nothing has run yet")
    S = len(stage_names)
    t0 = min(e["start_ns"] for e in events)
    idle, summary = bubbles(events, S)
    spans = [dict(e, idle=False) for e in events] + [dict(e, idle=True) for e in idle]
    trace = [dict(name="thread_name", ph="M", pid=0, tid=s, args=dict(name=stage_names[s])) for s in range(S)]
    for e in spans:
        label = e["phase"] if e["idle"] or e["micro_batch"] < 0 else f"{e['phase']} m{e['micro_batch']} k{e['chunk']}"
        trace.append(dict(
            name=label, cat=e["phase"], ph="X", pid=0, tid=e["stage"],
            ts=(e["start_ns"] - t0) / 1e3, dur=(e["end_ns"] - e["start_ns"]) / 1e3,
            args=dict(micro_batch=e["micro_batch"], chunk=e["chunk"]),
        ))
    with open(path, "w") as f:
        json.dump(dict(traceEvents=trace, displayTimeUnit="ms", otherData=summary), f)
    summary["json"] = path
    png = os.path.splitext(path)[0] + ".png"
    if _gantt(spans, t0, stage_names, png):
        summary["png"] = png
    else:
        warnings.warn(f"timeline: no Gantt chart ({png}): matplotlib is not installed (pip install matplotlib); "
                      f"the trace is in {path}", stacklevel=2)
    return summary


def _gantt(spans, t0: int, stage_names: Sequence[str], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    S = len(stage_names)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * S))
    for phase, color in _COLORS.items():
        for s in range(S):
            bars = [((e["start_ns"] - t0) / 1e6, (e["end_ns"] - e["start_ns"]) / 1e6)
                    for e in spans if e["stage"] == s and e["phase"] == phase]
            if bars:
                ax.broken_barh(bars, (S - 1 - s - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.5,
                               label=phase)
    ax.set_yticks(range(S))
    ax.set_yticklabels(list(reversed(stage_names)))
    ax.set_xlabel("ms")
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    ax.legend(seen.values(), seen.keys(), loc="upper right", ncol=4, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
