"""``predict``: one training step of a layout on a cluster, played over unit costs.

What it adds to the schedule (``play.py``):

* Sends: an item's activations forward, and its gradient (same size)
  backward, cross ``cluster.link(a, b)`` between the global ranks of
  the two stages (``dp_rank * pp + pp_rank``; replica 0 is played, the
  others run the same). Stages of one process on the CPU (``Layout.in_process``
  on a ``"cpu"`` cluster) share one device: no copy, ``cluster.same_device``.
* The data-parallel all-reduce: each stage's parameter gradients over its
  ``dp`` replicas (``cluster.allreduce_seconds``). It does not overlap the
  backward: ``PipelineParallel`` wraps each stage in DDP, whose bucket
  hooks all fire when the pipelined backward (one autograd node) returns,
  so the all-reduce starts after the stage's backward and weight tasks.
  Then the loss is shared (a broadcast over the pipeline, an all-reduce
  over the replicas), a latency each.
* Memory per stage (bytes), at its peak: the parameters; with dp > 1,
  DDP's gradient buckets (as large); in a process of its own before the
  last stage, the receives of every item's gradient, posted ahead; and the
  larger of (a) what the forward keeps for the backward (per item every
  unit's ``saved_bytes``, or for a recomputed item what its replay needs:
  the stage's input and each LSTM layer's initial state) plus the largest
  item's output and its gradient, and (b) the parameters' gradients, which
  grow as the kept activations are freed. The optimizer's state is not
  counted.
"""

from typing import List, Sequence

from .model import Cluster, Layout, Prediction, UnitCosts
from .play import StageCosts, play
from .schedule import CHECKPOINTS, item_grid, recomputes

__all__ = ["predict"]


def _check(costs: UnitCosts, layout: Layout, cluster: Cluster, T: int, B: int) -> list:
    for name in ("units", "seconds", "output_bytes", "saved_bytes"):
        if not callable(getattr(costs, name, None)):
            raise TypeError(f"predict: costs must be UnitCosts (e.g. from pipelstm.simulator.calibrate), "
                            f"got {type(costs).__name__} without {name}()")
    if not isinstance(layout, Layout):
        raise TypeError(f"predict: layout must be a pipelstm.simulator.Layout, got {type(layout).__name__}")
    if not isinstance(cluster, Cluster):
        raise TypeError(f"predict: cluster must be a pipelstm.simulator.Cluster, got {type(cluster).__name__}")
    for name, v in (("T", T), ("B", B), ("layout.dp", layout.dp), ("layout.pp", layout.pp),
                    ("layout.chunks", layout.chunks), ("layout.micro_batches", layout.micro_batches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"predict: {name} must be a positive int, got {v!r}")
    units = list(costs.units())
    balance = list(layout.balance)
    if len(balance) != layout.pp or any(not isinstance(n, int) or n < 1 for n in balance) \
            or sum(balance) != len(units):
        raise ValueError(f"predict: layout.balance must give pp={layout.pp} positive unit counts summing to the "
                         f"{len(units)} units (the loss included in the last), got {balance}")
    if layout.checkpoint not in CHECKPOINTS:
        raise ValueError(f"predict: layout.checkpoint must be one of {CHECKPOINTS}, got {layout.checkpoint!r}")
    if layout.dp * layout.pp > cluster.world_size:
        raise ValueError(f"predict: layout dp x pp = {layout.dp * layout.pp} ranks, but the cluster has "
                         f"{cluster.world_size} devices ({cluster.nodes} nodes x {cluster.devices_per_node})")
    if B % layout.dp:
        raise ValueError(f"predict: B={B} (the global batch) must be a multiple of layout.dp={layout.dp}")
    return units


def _stage_units(balance: Sequence[int]) -> List[range]:
    out, i = [], 0
    for n in balance:
        out.append(range(i, i + n))
        i += n
    return out


def predict(costs: UnitCosts, layout: Layout, cluster: Cluster, T: int, B: int) -> Prediction:
    """Predicts one training step (forward, backward, the data-parallel
    all-reduce; no optimizer step) of ``layout`` on ``cluster``.

    Args:
        costs: what each unit costs on one device (``calibrate``, or a
            model of another device's speed over it).
        layout: dp x pp, units per stage, K x M, recomputation.
        cluster: the devices and links.
        T: the sequence length of a step.
        B: the global batch of a step; each of the ``dp`` replicas runs
            ``B / dp`` sequences.

    Returns:
        A :class:`Prediction` (step time, bubble, per-stage peak memory,
        the timeline's events).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a layout that does not fit the units or the cluster,
            or sizes that are not positive (the message names the argument).
    """
    units = _check(costs, layout, cluster, T, B)
    S, dp = layout.pp, layout.dp
    K, M, t_sizes, b_sizes = item_grid(T, B // dp, layout.chunks, layout.micro_batches)
    stage_units = _stage_units(layout.balance)
    one_device = layout.in_process and cluster.device == "cpu"

    def link(s: int, to: int):
        return cluster.same_device if one_device else cluster.link(s, to)

    memo = {}

    def seconds(u: int, phase: str, t: int, b: int) -> float:
        key = (u, phase, t, b)
        if key not in memo:
            memo[key] = max(0.0, float(costs.seconds(u, phase, t, b)))
        return memo[key]

    def stage_seconds(phase: str):
        return lambda s, m, k: sum(seconds(u, phase, t_sizes[k], b_sizes[m]) for u in stage_units[s])

    def send(s: int, direction: str, m: int, k: int) -> float:
        boundary = s if direction == "forward" else s - 1  # the stage whose output crosses
        nbytes = costs.output_bytes(stage_units[boundary][-1], t_sizes[k], b_sizes[m])
        return link(s, s + 1 if direction == "forward" else s - 1).seconds(nbytes)

    def weights(s: int) -> List[float]:
        return [seconds(u, "weights", T, B // dp) for u in reversed(stage_units[s]) if units[u].param_bytes > 0]

    stage_costs = StageCosts(forward=stage_seconds("forward"), backward=stage_seconds("backward"), send=send,
                             weights=weights)
    groups = [0] * S if one_device else list(range(S))
    played = play(S, K, M, stage_costs, checkpoint=layout.checkpoint, in_process=layout.in_process,
                  groups=groups, pass_gap_s=float(getattr(costs, "pass_gap_s", 0.0)))

    grad_bytes = [sum(units[u].param_bytes for u in stage_units[s]) for s in range(S)]
    allreduce = [cluster.allreduce_seconds([d * S + s for d in range(dp)], grad_bytes[s]) for s in range(S)]
    backward_done = max(played.backward_end)
    done = max(e + a for e, a in zip(played.backward_end, allreduce))
    share = (cluster.link(S - 1, 0).seconds(8) if S > 1 else 0.0) + cluster.allreduce_seconds(
        [d * S for d in range(dp)], 8)
    step = done + share + float(getattr(costs, "step_overhead_s", 0.0))

    # Idle fraction of the stages from the first item to the end of the
    # backward (the gap between the passes, outside the engine, left out).
    gap = float(getattr(costs, "pass_gap_s", 0.0))
    span = max(played.backward_end) - gap
    bubble = 1.0 - sum(played.busy) / (S * span) if span > 0 else 0.0
    f_lo, f_hi = played.forward_span
    b_lo = f_hi + gap  # the last stage's backward (the first stage's forward may still run)

    peak = [_stage_bytes(costs, units, stage_units, s, layout, K, M, t_sizes, b_sizes)
            for s in range(S)]
    notes = (f"K={K}, M={M} (items of {t_sizes[0]}x{b_sizes[0]} and smaller); replica 0 played; "
             f"the all-reduce after each stage's backward (no overlap); no optimizer step")
    return Prediction(layout=layout, step_s=step, forward_s=f_hi - f_lo, backward_s=backward_done - b_lo,
                      allreduce_s=done - backward_done, bubble=bubble, stage_peak_bytes=peak,
                      events=played.events, notes=notes)


def _stage_bytes(costs: UnitCosts, units, stage_units, s: int, layout: Layout, K: int, M: int,
                 t_sizes: Sequence[int], b_sizes: Sequence[int]) -> float:
    """The peak bytes of stage ``s`` (see the module's docstring)."""
    mine = stage_units[s]
    params = sum(units[u].param_bytes for u in mine)
    kept = 0.0
    for m in range(M):
        for k in range(K):
            t, b = t_sizes[k], b_sizes[m]
            if recomputes(layout.checkpoint, m, k, K, M):
                kept += costs.output_bytes(mine[0] - 1, t, b) if s > 0 else 0.0
                kept += sum(units[u].state_bytes_per_row * b for u in mine)
            else:
                kept += sum(costs.saved_bytes(u, t, b) for u in mine)
    # the largest item's output being made and its gradient coming back
    transient = 2.0 * max(costs.output_bytes(u, t_sizes[0], b_sizes[0]) for u in mine)
    # a process of its own posts the receives of every item's gradient ahead
    posted = 0.0
    if not layout.in_process and s < layout.pp - 1:
        posted = sum(costs.output_bytes(mine[-1], t, b) for t in t_sizes for b in b_sizes)
    buckets = params if layout.dp > 1 else 0.0  # DDP's gradient buckets
    return params + buckets + posted + max(kept + transient, params)
