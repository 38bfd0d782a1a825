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
  so the all-reduce starts after the stage's backward and weight tasks;
  DDP's own handling of the gradients (``cluster.gradient_seconds``) comes
  with it.
  Then the loss is shared (a broadcast over the pipeline, an all-reduce
  over the replicas), a latency each.
* Memory (bytes), played along the schedule: what every item's forward
  keeps for its backward (per unit ``saved_bytes``; the first unit of a
  stage on a device or in a process of its own, ``first_saved_bytes`` where
  the costs give it, its input included; or for a recomputed
  item what its replay needs: the stage's input and each LSTM layer's
  initial state, the rest held from the replay on); the item's backward
  gives that back but, for each unit with parameters, keeps what their
  gradients need until the unit's weight task (the engine's pieces: an
  LSTM layer's input, output and gate gradients, a Linear's input and
  output gradient; counted as the unit's saved bytes plus its output's),
  so recomputation lowers what the forward holds, not the backward's
  peak; while an item runs, its output and its gradient; while an LSTM
  unit's weight task runs, the copy it joins its chunks' pieces into (the
  largest run of ``schedule.join_runs``); each unit's
  parameter gradients from the end of its weight task. On top, all step: the parameters; with dp > 1, DDP's
  gradient buckets (as large); in a process of its own before the last
  stage, the receives of every item's gradient, posted ahead. The peak of
  a stage, and of a process (all the stages of an in-process pipeline), is
  the most of that held at once. The optimizer's state is not counted.
* Shared cores (``cluster.compute_sharing`` above 1, a CPU): a stage's
  compute stretches by the part of it that runs beside another stage or
  replica of its node (``sharing.py``).
* Replicas in lock step (``cluster.replica_wait`` above 1): with dp > 1
  each step waits for the slowest replica, so the played step (up to the
  end of the backward) stretches by ``cluster.replica_wait_for(dp)``.
"""

from typing import List, Sequence

from .model import Cluster, Layout, Prediction, UnitCosts
from .play import StageCosts, play
from .schedule import CHECKPOINTS, item_grid, join_runs, recomputes
from .sharing import stretches

__all__ = ["predict"]

# Plays that settle how much sharing a node's cores stretches each stage
# (sharing.py): each play's overlaps give the next one's costs.
SHARING_ROUNDS = 3


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

    first_saved = getattr(costs, "first_saved_bytes", None)

    def unit_saved(s: int, u: int, t: int, b: int) -> float:
        if first_saved is not None and s > 0 and not one_device and u == stage_units[s][0]:
            return first_saved(u, t, b)  # its input, received, is its own
        return costs.saved_bytes(u, t, b)

    def full(s: int, m: int, k: int) -> float:
        return sum(unit_saved(s, u, t_sizes[k], b_sizes[m]) for u in stage_units[s])

    def piece(s: int, u: int, t: int, b: int) -> float:
        # what a unit with parameters keeps from its backward for their
        # gradients: what its forward kept, and the gradient of its output
        return unit_saved(s, u, t, b) + costs.output_bytes(u, t, b) if units[u].param_bytes > 0 else 0.0

    def pieces(s: int, m: int, k: int) -> float:
        return sum(piece(s, u, t_sizes[k], b_sizes[m]) for u in stage_units[s])

    def joined(s: int, u: int) -> float:
        # an LSTM unit's weight task copies each run of chunks it joins
        # (join_runs) into one sequence: the largest run's pieces at once
        if units[u].kind != "lstm":
            return 0.0
        return max((sum(piece(s, u, t_sizes[k], b) for k in range(a, e))
                    for b in b_sizes for a, e in join_runs([t * b for t in t_sizes]) if e - a > 1), default=0.0)

    def weights(s: int) -> List[tuple]:
        return [(seconds(u, "weights", T, B // dp), units[u].param_bytes,
                 sum(piece(s, u, t, b) for t in t_sizes for b in b_sizes), joined(s, u))
                for u in reversed(stage_units[s]) if units[u].param_bytes > 0]

    def kept(s: int, m: int, k: int) -> float:
        if not recomputes(layout.checkpoint, m, k, K, M):
            return full(s, m, k)
        first = stage_units[s][0]  # a replay needs the stage's input and each LSTM layer's initial state
        entering = costs.output_bytes(first - 1, t_sizes[k], b_sizes[m]) if s > 0 else 0.0
        return entering + sum(units[u].state_bytes_per_row * b_sizes[m] for u in stage_units[s])

    def transient(s: int, m: int, k: int) -> float:  # the item's output in the making, its gradient coming back
        return 2.0 * max(costs.output_bytes(u, t_sizes[k], b_sizes[m]) for u in stage_units[s])

    forward, backward = stage_seconds("forward"), stage_seconds("backward")

    def stage_costs(factor) -> StageCosts:  # factor[(stage, pass)]: what sharing the cores stretches it by
        return StageCosts(forward=lambda s, m, k: factor[(s, "forward")] * forward(s, m, k),
                          backward=lambda s, m, k: factor[(s, "backward")] * backward(s, m, k), send=send,
                          weights=lambda s: [(factor[(s, "weights")] * sec, g, f, j) for sec, g, f, j in weights(s)],
                          kept=kept, full=full, pieces=pieces, transient=transient)

    groups = [0] * S if one_device else list(range(S))

    def played_with(factor):
        return play(S, K, M, stage_costs(factor), checkpoint=layout.checkpoint, in_process=layout.in_process,
                    groups=groups, pass_gap_s=float(getattr(costs, "pass_gap_s", 0.0)))

    played = played_with({(s, p): 1.0 for s in range(S) for p in ("forward", "backward", "weights")})
    if cluster.compute_sharing > 1.0:  # stages and replicas of one node slow each other down
        node_of = [0] * S if one_device else [cluster.node_of(s) for s in range(S)]
        alongside = [any(cluster.node_of(d * S + s) == cluster.node_of(s) for d in range(1, dp)) for s in range(S)]
        for _ in range(SHARING_ROUNDS):
            played = played_with(stretches(played.events, S, node_of, alongside, cluster.compute_sharing))

    return _prediction(played, costs, layout, cluster, units, stage_units, (K, M, t_sizes, b_sizes))


def _prediction(played, costs: UnitCosts, layout: Layout, cluster: Cluster, units, stage_units,
                grid) -> Prediction:
    """The step's figures from the played replica: its all-reduce after each
    stage's backward, the bubble, the peaks of memory per stage and per
    process."""
    K, M, t_sizes, b_sizes = grid
    S, dp = layout.pp, layout.dp
    grad_bytes = [sum(units[u].param_bytes for u in stage_units[s]) for s in range(S)]
    allreduce = [cluster.allreduce_seconds([d * S + s for d in range(dp)], grad_bytes[s])
                 + cluster.gradient_seconds(dp, grad_bytes[s]) for s in range(S)]
    wait = cluster.replica_wait_for(dp)  # every replica's step waits for the slowest
    backward_done = max(played.backward_end) * wait
    done = max(e * wait + a for e, a in zip(played.backward_end, allreduce))
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

    # Bytes held all step: the parameters; DDP's gradient buckets (dp > 1);
    # in a process of its own before the last stage, the gradient receives
    # of every item, posted ahead.
    held = [sum(units[u].param_bytes for u in stage_units[s]) * (2 if dp > 1 else 1) for s in range(S)]
    if not layout.in_process:
        for s in range(S - 1):
            held[s] += sum(costs.output_bytes(stage_units[s][-1], t, b) for t in t_sizes for b in b_sizes)
    peak = [held[s] + played.peak([s]) for s in range(S)]
    processes = [list(range(S))] if layout.in_process else [[s] for s in range(S)]
    process_peak = [sum(held[s] for s in p) + played.peak(p) for p in processes]
    notes = (f"K={K}, M={M} (items of {t_sizes[0]}x{b_sizes[0]} and smaller); replica 0 played; "
             f"the all-reduce after each stage's backward (no overlap); no optimizer step")
    return Prediction(layout=layout, step_s=step, forward_s=f_hi - f_lo, backward_s=backward_done - b_lo,
                      allreduce_s=done - backward_done, bubble=bubble, stage_peak_bytes=peak,
                      process_peak_bytes=process_peak,
                      events=played.events, notes=notes)
