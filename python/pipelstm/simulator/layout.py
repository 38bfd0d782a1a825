"""The automatic layout: the fastest predicted dp x pp, balance, K x M and
recomputation that fits the devices' memory.

``choose_layout`` tries every pipeline depth that divides the world (at
most one stage per unit), splits the units by their calibrated costs at the
item size (``pipeline.balance.partition``, as the pipeline's own
``balance="auto"`` splits them), a small set of chunk and micro-batch counts,
and recomputation only where the memory requires it; the simulator predicts
each, and the fastest that fits wins, or with a ``margin`` the simplest
(fewest processes, stages, items) of those predicted within it of the
fastest. Its ``why`` says by how much it beats the best of each other depth.
"""

from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

from ..pipeline.balance import partition
from ..pipeline.units import LSTM_KINDS
from .model import Cluster, Layout, Prediction, UnitCosts

__all__ = ["LayoutChoice", "choose_layout", "simplest", "complexity", "search_sizes", "seed_layout", "stage_costs",
           "LOSS_KINDS", "CHUNKS", "MICRO_BATCHES", "PLAN_MARGIN"]

LOSS_KINDS = ("cross_entropy",)  # units the engine runs inside the last stage, not stages of their own
CHUNKS = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4, 8)
CHECKPOINTS = ("never", "except_last", "always")  # cheapest first: recomputation costs time
# The automatic layout's margin (``simplest``): the simulator's error against
# steps measured on a CPU (docs/simulator.md) is of this order.
PLAN_MARGIN = 0.10
GIB, MIB = 2.0 ** 30, 2.0 ** 20

Predict = Callable[[UnitCosts, Layout, Cluster, int, int], Prediction]


class LayoutChoice(NamedTuple):
    """What ``choose_layout`` returns: the layout, its prediction, and why it won."""

    layout: Layout
    prediction: Prediction
    why: str


def _default_predict() -> Predict:
    from .. import simulator

    fn = getattr(simulator, "predict", None)
    if fn is None:
        raise RuntimeError("choose_layout: pipelstm.simulator.predict is not available in this build")
    return fn


def stage_costs(costs: UnitCosts, t: int, b: int, chunks: int, micro_batches: int,
                whole: Optional[Tuple[int, int]] = None) -> List[float]:
    """Each unit's seconds per step when a step is ``chunks`` x
    ``micro_batches`` items of ``t`` steps by ``b`` sequences: forward and
    backward per item, and the weight gradients once for the whole pass
    (``whole``: its steps and sequences; default ``t * chunks`` by
    ``b * micro_batches``)."""
    items = chunks * micro_batches
    whole = whole or (t * chunks, b * micro_batches)
    out = []
    for u in range(len(costs.units())):
        per_item = costs.seconds(u, "forward", t, b) + costs.seconds(u, "backward", t, b)
        out.append(per_item * items + costs.seconds(u, "weights", *whole))
    return out


def _balance(costs: UnitCosts, pp: int, T: int, rows: int, chunks: int, micro_batches: int) -> List[int]:
    """Units per stage: the units before the loss split by their costs at
    the pass's largest item, the loss in the last stage."""
    from .schedule import item_grid

    units = costs.units()
    loss = 1 if units and units[-1].kind in LOSS_KINDS else 0
    K, M, t_sizes, b_sizes = item_grid(T, rows, chunks, micro_batches)
    weights = stage_costs(costs, t_sizes[0], b_sizes[0], K, M, whole=(T, rows))[: len(units) - loss]
    sizes = partition(weights, pp)
    sizes[-1] += loss
    return sizes


def seed_layout(costs: UnitCosts, world_size: int) -> Layout:
    """The seed's scheme on ``world_size`` devices: one LSTM layer per
    pipeline stage (the units before the first LSTM with it, those after the
    last with it), no time chunks and one micro-batch (K = M = 1), the rest
    of the world as data-parallel replicas.

    Raises:
        ValueError: the model has no LSTM layer, or the world is not a
            multiple of its LSTM layers.
    """
    kinds = [u.kind for u in costs.units()]
    lstm = [i for i, k in enumerate(kinds) if k in LSTM_KINDS]
    if not lstm:
        raise ValueError("seed_layout: the model has no LSTM layer")
    pp = len(lstm)
    if world_size % pp:
        raise ValueError(f"seed_layout: world_size={world_size} is not a multiple of the {pp} LSTM layers")
    cuts = lstm[1:] + [len(kinds)]
    balance, start = [], 0
    for c in cuts:
        balance.append(c - start)
        start = c
    return Layout(dp=world_size // pp, pp=pp, balance=balance, chunks=1, micro_batches=1)


def _check(T, B, world, chunks, micro_batches, memory, pp) -> None:
    for name, v in (("T", T), ("B", B)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"choose_layout: {name} must be a positive int, got {v!r}")
    for name, vs in (("chunks", chunks), ("micro_batches", micro_batches)):
        if not vs or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in vs):
            raise ValueError(f"choose_layout: {name} must be a non-empty list of positive ints, got {vs!r}")
    if memory is not None and not memory > 0:
        raise ValueError(f"choose_layout: memory must be positive bytes, got {memory!r}")
    if pp is not None and (isinstance(pp, bool) or not isinstance(pp, int) or pp < 1 or world % pp):
        raise ValueError(f"choose_layout: pp must be a positive divisor of the world size {world}, got {pp!r}")


def search_sizes(T: int, B: int, world: int, chunks: Sequence[int] = CHUNKS,
                 micro_batches: Sequence[int] = MICRO_BATCHES) -> List[Tuple[int, int]]:
    """Every item size ``(t, b)`` :func:`choose_layout` asks the costs for
    on ``world`` devices (each dp's items as the engine cuts them, and each
    replica's whole ``(T, B / dp)`` for the parameter gradients): calibrate
    at these and every prediction of the search reads a measured size
    instead of the fit's extrapolation.
    """
    from .schedule import item_grid

    sizes = set()
    for dp in (d for d in range(1, world + 1) if world % d == 0 and B % d == 0):
        rows = B // dp
        sizes.add((T, rows))
        for K in chunks:
            for M in micro_batches:
                if K <= T and M <= rows:
                    _, _, t_sizes, b_sizes = item_grid(T, rows, K, M)
                    sizes.update((t, b) for t in t_sizes for b in b_sizes)
    return sorted(sizes)


def choose_layout(costs: UnitCosts, cluster: Union[Cluster, int], T: int, B: int, *,
                  pp: Optional[int] = None, balance: Optional[Sequence[int]] = None,
                  chunks: Sequence[int] = CHUNKS, micro_batches: Sequence[int] = MICRO_BATCHES,
                  checkpoints: Sequence[str] = CHECKPOINTS, memory: Optional[float] = None,
                  in_process: bool = False, predict: Optional[Predict] = None, margin: float = 0.0) -> LayoutChoice:
    """The fastest predicted layout of the model ``costs`` describes for a
    global batch of ``B`` sequences of ``T`` steps that fits the devices' memory.

    Args:
        costs: the units' calibrated costs (``pipelstm.simulator.calibrate``).
        cluster: the cluster, or a process count on this machine
            (``clusters.local_machine``, its loopback link measured).
        T, B: steps and sequences of one training step (B: over all replicas).
        pp: fix the pipeline depth (e.g. a mesh that exists); default: try
            every divisor of the world size up to the unit count.
        balance: fix the units per stage (with ``pp``; the loss counted in
            the last); default: split by the costs at the item size.
        chunks, micro_batches: the K and M to try (those that fit T and the
            replica's batch).
        checkpoints: the recomputation modes allowed, tried in this order
            until one fits the memory (default: none first, then more).
        memory: bytes per device; default the cluster's ``device_memory``.
            A layout fits when every stage's predicted peak (parameters,
            gradients, kept activations) does; the optimizer's state is not
            counted: pass less to leave room for it.
        in_process: the stages of a replica are one process's
            (``pipelstm.Pipeline``) instead of a process each.
        predict: the simulator (default ``pipelstm.simulator.predict``).
        margin: how much faster a layout with more pipeline stages or work
            items must be predicted to be taken over a simpler one
            (:func:`simplest`); 0: the fastest predicted.

    Returns:
        A :class:`LayoutChoice` ``(layout, prediction, why)``; ``why`` is the
        printable plan: the predicted step, and the margin over the best
        layout of every other pipeline depth tried.

    Raises:
        ValueError: a bad argument (named), no layout for this world and
            batch, or none that fits the memory (the smallest need is given).
    """
    if isinstance(cluster, int) and not isinstance(cluster, bool):
        from .clusters import local_machine

        cluster = local_machine(cluster)
    if not isinstance(cluster, Cluster):
        raise ValueError(f"choose_layout: cluster must be a Cluster or a process count, got {cluster!r}")
    world = cluster.world_size
    _check(T, B, world, chunks, micro_batches, memory, pp)
    if not checkpoints or any(c not in CHECKPOINTS for c in checkpoints):
        raise ValueError(f"choose_layout: checkpoints must be a non-empty list of {CHECKPOINTS}, got {checkpoints!r}")
    memory = cluster.device_memory if memory is None else float(memory)
    predict = predict or _default_predict()
    units = costs.units()
    stages_max = len(units) - (1 if units and units[-1].kind in LOSS_KINDS else 0)
    depths = [pp] if pp is not None else [p for p in range(1, world + 1) if world % p == 0 and p <= stages_max]
    if balance is not None and pp is None:
        raise ValueError("choose_layout: a fixed balance needs a fixed pp")
    if not depths or depths[0] > stages_max:
        raise ValueError(f"choose_layout: pp={pp} stages but the model has {stages_max} units to split")
    best_of: dict = {}  # pp -> (step, layout, prediction)
    fits: List[Tuple[Layout, Prediction]] = []
    smallest_need: Tuple[float, Optional[Layout]] = (float("inf"), None)
    for p in depths:
        dp = world // p
        rows = B // dp
        if B % dp:  # each replica runs B / dp sequences
            continue
        for K in sorted(set(chunks)):
            for M in sorted(set(micro_batches)):
                if K > T or M > rows:
                    continue
                split = list(balance) if balance is not None else _balance(costs, p, T, rows, K, M)
                for ck in checkpoints:
                    layout = Layout(dp=dp, pp=p, balance=split, chunks=K, micro_batches=M, checkpoint=ck,
                                    **({"in_process": True} if in_process else {}))
                    pred = predict(costs, layout, cluster, T, B)
                    need = max(pred.stage_peak_bytes) if pred.stage_peak_bytes else 0.0
                    if need > memory:
                        smallest_need = min(smallest_need, (need, layout), key=lambda x: x[0])
                        continue  # recomputation may make it fit
                    fits.append((layout, pred))
                    key = (pred.step_s, K * M, K)  # ties: the fewest items
                    if p not in best_of or key < best_of[p][0]:
                        best_of[p] = (key, layout, pred)
                    break
    if not best_of:
        if smallest_need[1] is None:
            raise ValueError(f"choose_layout: no layout of {world} devices can run a batch of B={B} sequences "
                             f"of T={T} steps (each of the dp replicas runs B / dp of them, dp = world / pp "
                             f"for pp in {depths})")
        raise ValueError(f"choose_layout: no layout fits in {memory / GIB:.2f} GiB per device; the smallest "
                         f"needs {smallest_need[0] / GIB:.2f} GiB ({_name(smallest_need[1])})")
    fastest = min(fits, key=lambda f: f[1].step_s)
    layout, pred = simplest(fits, margin)
    why = _why(layout, pred, best_of, layout.pp, cluster, T, B)
    if layout != fastest[0]:
        why += (f"\n  taken over the fastest predicted ({_name(fastest[0])}, {fastest[1].step_s * 1e3:.3f} ms): "
                f"within the margin of {margin:.0%}, with fewer stages or items")
    return LayoutChoice(layout, pred, why)


def complexity(layout: Layout) -> Tuple[int, int, int, int]:
    """How much a layout synchronises, for :func:`simplest`: its processes
    (one for an in-process pipeline), its stages, its items (K x M), its K."""
    processes = 1 if layout.in_process else layout.dp * layout.pp
    return processes, layout.pp, layout.chunks * layout.micro_batches, layout.chunks


def simplest(candidates: Sequence[Tuple[Layout, Prediction]], margin: float) -> Tuple[Layout, Prediction]:
    """Of ``(layout, prediction)`` pairs, the least complex layout
    (:func:`complexity`) among those predicted within ``margin`` of the
    fastest: a layout with more processes, stages or items, each a point
    where the real run waits in ways the simulator only approximates, must
    be predicted at least ``margin`` faster to be taken.

    Raises:
        ValueError: no candidates, or a negative margin.
    """
    if not candidates:
        raise ValueError("simplest: no candidates")
    if not margin >= 0:
        raise ValueError(f"simplest: margin must be a non-negative fraction, got {margin!r}")
    best = min(p.step_s for _, p in candidates)
    close = [c for c in candidates if c[1].step_s <= best * (1.0 + margin)]
    return min(close, key=lambda c: (complexity(c[0]), c[1].step_s))


def _name(layout: Layout) -> str:
    return (f"dp={layout.dp} x pp={layout.pp}, balance {list(layout.balance)}, K={layout.chunks}, "
            f"M={layout.micro_batches}, checkpoint {layout.checkpoint}")


def _why(layout: Layout, pred: Prediction, best_of: dict, winner: int, cluster: Cluster, T: int, B: int) -> str:
    lines = [f"layout for {cluster.world_size} x {cluster.device} (T={T}, B={B}): {_name(layout)}",
             f"  predicted step {pred.step_s * 1e3:.3f} ms (bubble {pred.bubble:.0%}, all-reduce adds "
             f"{pred.allreduce_s * 1e3:.3f} ms, peak {max(pred.stage_peak_bytes or [0]) / MIB:.1f} MiB per device)"]
    for p in sorted(best_of):
        if p == winner:
            continue
        _, other, op = best_of[p]
        ratio = op.step_s / pred.step_s
        verdict = (f"pp={winner} beats pp={p} by {ratio:.2f}x" if ratio >= 1 else
                   f"pp={p} is predicted {1 / ratio:.2f}x faster, within the margin")
        lines.append(f"  {verdict} (its best: {_name(other)}, "
                     f"{op.step_s * 1e3:.3f} ms, bubble {op.bubble:.0%}, all-reduce {op.allreduce_s * 1e3:.3f} ms)")
    return "\n".join(lines)
