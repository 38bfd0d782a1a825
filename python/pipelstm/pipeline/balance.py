"""Balancing: the units' costs, and their split into stages.

A unit's cost is estimated by the FLOP cost model (``Unit.cost_per_token``,
from the table of pipeline/units.py) or, given a sample input, measured by
timing its forward and backward (the profiler). ``partition`` then splits
the costs into contiguous stages, minimising the slowest.
"""

import logging
import math
import time
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .units import Unit

__all__ = ["partition", "resolve_balance", "estimate_costs", "profile", "kept_bytes"]

logger = logging.getLogger(__name__)


def partition(costs: Sequence[float], stages: int) -> List[int]:
    """Splits ``costs`` into ``stages`` contiguous non-empty runs minimising the
    largest run's sum (the slowest stage); returns the run lengths.

    Dynamic programming over (stage, units so far), O(stages * n^2); among
    equally good splits the one with the earliest, smallest stages first.

    Raises:
        ValueError: ``stages`` is not between 1 and ``len(costs)``.
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} units into {stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    INF = float("inf")
    # best[s][i]: the smallest possible slowest stage splitting units[:i] into s stages
    best = [[INF] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                v = max(best[s - 1][j], prefix[i] - prefix[j])
                if v < best[s][i] - 1e-15 * max(1.0, abs(v)):
                    best[s][i], cut[s][i] = v, j
    sizes, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def resolve_balance(balance: Union[str, Sequence[int]], units: Sequence[Unit], stages: int, who: str) -> List[int]:
    """Units per stage: ``"auto"`` splits by the units' costs; a given list is checked.

    Raises:
        ValueError: ``balance`` is another string, or a list that does not
            give each stage a positive count summing to the units.
    """
    n = len(units)
    if isinstance(balance, str):
        if balance != "auto":
            raise ValueError(f"{who}: balance must be 'auto' or a list of unit counts, got {balance!r}")
        sizes = partition([u.cost for u in units], stages)
        _log_plan(who, "by the units' costs", sizes, units)
        return sizes
    balance = list(balance)
    if len(balance) != stages or any(not isinstance(b, int) or b < 1 for b in balance):
        raise ValueError(f"{who}: balance {balance} must give a positive unit count for each of the {stages} stages")
    if sum(balance) != n:
        raise ValueError(f"{who}: balance {balance} sums to {sum(balance)}, but the model has {n} units "
                         f"({', '.join(u.name for u in units)})")
    _log_plan(who, "as given", balance, units)
    return balance


def _log_plan(who: str, how: str, sizes: Sequence[int], units: Sequence[Unit]) -> None:
    """Logs (INFO) the units of each stage and its share of the estimated cost."""
    if not logger.isEnabledFor(logging.INFO):
        return
    costs = [float(getattr(u, "cost", 0.0) or 0.0) for u in units]
    total = sum(costs)
    stages, start = [], 0
    for s, size in enumerate(sizes):
        names = ", ".join(u.name for u in units[start:start + size])
        share = f"{100 * sum(costs[start:start + size]) / total:.0f}% of the cost" if total > 0 else "cost unknown"
        stages.append(f"stage {s}: {names} ({share})")
        start += size
    logger.info("%s: %d units in %d stages, %s; %s", who, len(units), len(sizes), how, "; ".join(stages))


def estimate_costs(units: Sequence[Unit], sample: Optional[Tensor] = None) -> Optional[Tuple[int, int]]:
    """Sets each unit's ``cost`` and ``act_bytes``: by the FLOP cost model
    (FLOPs and bytes per token) or, with a time-major ``sample`` (``[T, B, ...]``,
    fed to the first unit), by profiling each unit on its current device
    (seconds, bytes for the whole sample). Returns the sample's ``(T, B)``,
    or None for the cost model."""
    if sample is None:
        for u in units:
            u.cost, u.act_bytes = u.cost_per_token()
        return None
    x = sample
    for u in units:
        x, u.cost, u.act_bytes = profile(u, x)
    return sample.shape[0], sample.shape[1]


def profile(u: Unit, x: Tensor, reps: int = 2) -> Tuple[Tensor, float, float]:
    """Times forward + backward of one unit on x (on the unit's current
    device); returns (its output, seconds, bytes of activations saved)."""
    fn = u.reference()
    best = math.inf
    y = None
    for _ in range(reps + 1):  # the first run warms up
        xi = x.detach().requires_grad_(x.is_floating_point())
        t = time.perf_counter()
        y = fn(xi)
        if y.requires_grad:
            y.backward(torch.ones_like(y))
        dt = time.perf_counter() - t
        best = min(best, dt)
    with torch.no_grad():
        for w in u.params():
            if w is not None:
                w.grad = None
    _, per_token = u.cost_per_token()
    tokens = x.shape[0] * x.shape[1]
    return y.detach(), best, per_token * tokens


def kept_bytes(units: Sequence[Unit], checkpoint: str) -> float:
    """Activation bytes a stage keeps for backward (per token, or for the
    profiled sample): everything its units save, or with recomputation its
    input and the dropout masks (the initial states are per chunk, not per
    token, and left out)."""
    if checkpoint == "never":
        return sum(u.act_bytes for u in units)
    per_token = [u.cost_per_token()[1] for u in units]
    scale = units[0].act_bytes / per_token[0] if per_token[0] else 1.0  # tokens of the sample
    first = units[0]
    kept = 8.0 if first.kind == "embedding" else float(first.input_size or first.out_size) * first.element_size()
    kept += sum(b for u, b in zip(units[1:], per_token[1:]) if u.is_dropout)
    return kept * scale
