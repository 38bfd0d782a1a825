"""Timing helpers shared by the benchmarks."""

import statistics
import time
from typing import Callable, Dict, List

import torch

__all__ = ["interleaved_medians", "gemm_gflops"]


def interleaved_medians(
    fns: Dict[str, Callable[[], None]], repeats: int, warmup: int = 1, device: str = "cpu"
) -> Dict[str, float]:
    """Median seconds of each function, run alternately so drift hits all alike.

    On CUDA each run is timed from a synchronised start to a synchronised end.
    """
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def gemm_gflops(n: int = 2048, repeats: int = 5, device: str = "cpu") -> float:
    """GFLOP/s of one large square fp32 torch.mm (at the current thread count on the CPU)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    seconds = interleaved_medians({"mm": lambda: torch.mm(a, b)}, repeats, device=device)["mm"]
    return 2 * n**3 / seconds / 1e9
