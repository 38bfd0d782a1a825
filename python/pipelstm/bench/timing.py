"""Timing helpers shared by the benchmarks."""

import statistics
import time
from typing import Callable, Dict, List

import torch

__all__ = ["interleaved_medians", "gemm_gflops"]


def interleaved_medians(fns: Dict[str, Callable[[], None]], repeats: int, warmup: int = 1) -> Dict[str, float]:
    """Median seconds of each function, run alternately so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def gemm_gflops(n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of one large square fp32 torch.mm at the current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = interleaved_medians({"mm": lambda: torch.mm(a, b)}, repeats)["mm"]
    return 2 * n**3 / seconds / 1e9
