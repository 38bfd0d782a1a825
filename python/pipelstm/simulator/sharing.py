"""Compute that shares a node's cores: how much each stage's work stretches.

On a CPU, pipeline stages (threads of one process or processes of their
own) and data-parallel replicas are not independent devices: while two of
them compute at once, each runs slower (``Cluster.compute_sharing``, the
factor measured with every core busy). The player (``play.py``) gives each
item a fixed cost, so the stretch is found by playing again: from one
play, the part of each stage's busy time in which another compute stream
of its node ran too; each stage's costs in that pass are stretched by
``1 + (sharing - 1) * that part``; the next play uses them. Replicas of a
stage on the same node run the same schedule at the same time, so they
overlap all of it.
"""

from typing import Dict, List, Sequence, Tuple

__all__ = ["PASS_OF", "stretches"]

# Which of a stage's costs an event's time comes from: a recomputation is
# the forward's cost, replayed in the backward pass.
PASS_OF = {"forward": "forward", "backward": "backward", "recompute": "forward", "weights": "weights"}


def _merged(intervals: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(a: int, b: int, union: List[Tuple[int, int]]) -> int:
    return sum(max(0, min(b, y) - max(a, x)) for x, y in union)


def stretches(events: Sequence[dict], stages: int, node_of: Sequence[int], replicas_alongside: Sequence[bool],
              sharing: float) -> Dict[Tuple[int, str], float]:
    """Each stage's cost factor per pass, from one play's ``events``.

    Args:
        events: the played events (engine trace format).
        stages: the pipeline's stages.
        node_of: per stage, the node (or process group of cores) it runs on.
        replicas_alongside: per stage, whether another replica of it runs
            on the same node (then all its time is shared).
        sharing: ``Cluster.compute_sharing``.

    Returns:
        ``{(stage, pass): factor}`` for the passes "forward", "backward"
        and "weights" (1.0 where nothing ran beside it).
    """
    compute = [[] for _ in range(stages)]
    for e in events:
        if e["phase"] in PASS_OF:
            compute[e["stage"]].append((e["start_ns"], e["end_ns"], PASS_OF[e["phase"]]))
    out: Dict[Tuple[int, str], float] = {}
    for s in range(stages):
        others = _merged([(a, b) for o in range(stages) if o != s and node_of[o] == node_of[s]
                          for a, b, _ in compute[o]])
        for phase in ("forward", "backward", "weights"):
            mine = [(a, b) for a, b, p in compute[s] if p == phase]
            total = sum(b - a for a, b in mine)
            if replicas_alongside[s]:
                shared = 1.0
            else:
                shared = sum(_covered(a, b, others) for a, b in mine) / total if total > 0 else 0.0
            out[(s, phase)] = 1.0 + (sharing - 1.0) * shared
    return out
