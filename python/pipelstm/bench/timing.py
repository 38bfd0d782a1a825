"""Timing helpers shared by the benchmarks.

Every bench alternates the things it compares, run by run, in one loop
(:func:`interleaved_times`), so that drift and other processes' noise hit
all of them alike, and reports the median of each.
"""

import argparse
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import report
from .table import Column, add_row

__all__ = ["add_device_argument", "add_min_run_argument", "check_device", "device_label", "interleaved_times",
           "interleaved_medians", "training_step_times", "training_step_rows", "medians", "median_index", "spread",
           "gemm_gflops"]


def interleaved_times(
    fns: Dict[str, Callable[[], Optional[float]]], repeats: int, warmup: int = 1, device: str = "cpu",
    min_run_seconds: float = 0.0,
) -> Dict[str, List[float]]:
    """Seconds of each of ``repeats`` runs of every function, run alternately
    (one run of each, then the next round) after ``warmup`` untimed rounds.

    A function may return its own measured seconds as a ``float`` (e.g. a
    step timed inside worker processes); that replaces the wall time around
    the call (any other return value is ignored). On CUDA each run is timed from a synchronised start to a
    synchronised end.

    With ``min_run_seconds``, a run of a function that takes less is the
    mean of ``n`` back-to-back calls, ``n`` fixed per function from the time
    of one warm call so that a run lasts about that long; the warm-up rounds
    are then ``n`` calls each too. Timed one call at a time, a 0.1 ms call
    varies by half its time from run to run (a cache flushed, a timer tick),
    and its first few calls in a fresh process are slower than the rest
    (``timeit``'s autorange and ``torch.utils.benchmark`` do the same).
    Functions that return their own seconds are always called once a run.
    """
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    calls = {name: 1 for name in fns}
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    if min_run_seconds > 0:
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            own = fn()
            sync()
            if not isinstance(own, float):
                one = max(time.perf_counter() - start, 1e-9)
                calls[name] = max(1, math.ceil(min_run_seconds / one))
        for _ in range(warmup):
            for name, fn in fns.items():
                for _ in range(calls[name] - 1):
                    fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            for _ in range(calls[name]):
                own = fn()
            sync()
            times[name].append(own if isinstance(own, float) else (time.perf_counter() - start) / calls[name])
    return times


def training_step_times(models: Dict[str, torch.nn.Module], x: torch.Tensor, repeats: int,
                        device: str = "cpu") -> Dict[str, List[float]]:
    """:func:`interleaved_times` of each model's training step on ``x``: the forward, then the backward of
    the sum of its output (the first of what it returns, as ``nn.LSTM``'s)."""
    def step(model: torch.nn.Module) -> None:
        model(x)[0].sum().backward()

    return interleaved_times({name: (lambda m=m: step(m)) for name, m in models.items()}, repeats, device=device)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device`` (cpu or cuda; default cpu): where a training-step benchmark's models run."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the models run, in float32 (default: %(default)s; on cuda the thread counts "
                             "are the host's)")


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """Stops with a usage error where ``device`` is cuda and torch sees no CUDA device."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")


def device_label(device: str) -> str:
    """Where a training-step benchmark's models ran, for its header: the CPU and its ISA, or the GPU's name."""
    return f"CPU, {report.isa_label()}" if device == "cpu" else torch.cuda.get_device_name()


def training_step_rows(columns: List[Column], threads: List[int], shape: Tuple[int, int, int], repeats: int,
                       make_models: Callable[[torch.Tensor], Dict[str, torch.nn.Module]],
                       ratios: Callable[[Dict[str, float]], dict], device: str = "cpu") -> List[dict]:
    """A row of ``columns`` for each thread count: the models ``make_models(x)`` builds for an input
    ``x`` of ``shape`` (T, B, H), both drawn after ``torch.manual_seed(0)`` on the CPU and then moved to
    ``device``, timed by :func:`training_step_times`; the row holds the sizes, each model's median,
    ``ratios(medians)`` and the samples."""
    rows: List[dict] = []
    T, B, H = shape
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        torch.manual_seed(0)
        x = torch.randn(T, B, H, requires_grad=True)
        models = make_models(x)
        if device != "cpu":
            models = {name: model.to(device) for name, model in models.items()}
            x = x.detach().to(device).requires_grad_()
        times = training_step_times(models, x, repeats, device)
        t = medians(times)
        add_row(rows, columns, dict(threads=n_threads, T=T, B=B, H=H, **t, **ratios(t), samples=times))
    return rows


def add_min_run_argument(parser: argparse.ArgumentParser) -> None:
    """``--min-run-ms`` (default 20): ``min_run_seconds`` of :func:`interleaved_times`, in ms."""
    parser.add_argument("--min-run-ms", type=float, default=20.0,
                        help="a run of a call shorter than this is the mean of as many calls as fill it "
                             "(0: one call a run)")


def interleaved_medians(
    fns: Dict[str, Callable[[], Optional[float]]], repeats: int, warmup: int = 1, device: str = "cpu"
) -> Dict[str, float]:
    """Median seconds of each function, run alternately so drift hits all alike."""
    return medians(interleaved_times(fns, repeats, warmup, device))


def medians(times: Dict[str, List[float]]) -> Dict[str, float]:
    """The median of each function's runs (``interleaved_times``' result)."""
    return {name: statistics.median(ts) for name, ts in times.items()}


def median_index(samples: List[float]) -> int:
    """The index of the run whose time is the median (the lower middle one
    for an even count), so that figures taken in that same run (busy times,
    bubbles) go with the median."""
    order = sorted(range(len(samples)), key=lambda i: samples[i])
    return order[(len(order) - 1) // 2]


def spread(samples: List[float]) -> str:
    """The fastest and the slowest run, ``min-max`` seconds, for a table."""
    return f"{min(samples):.3f}-{max(samples):.3f}"


def gemm_gflops(n: int = 2048, repeats: int = 5, device: str = "cpu") -> float:
    """GFLOP/s of one large square fp32 torch.mm (at the current thread count on the CPU)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    seconds = interleaved_medians({"mm": lambda: torch.mm(a, b)}, repeats, device=device)["mm"]
    return 2 * n**3 / seconds / 1e9
