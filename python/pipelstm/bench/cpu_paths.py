"""``python -m pipelstm.bench cpu_paths``: the CPU path chosen by timing
(``pipelstm.backends.cpu.benchmark``): whether it picks the fastest path,
and what choosing costs a short training run.

For each shape, a ``pipelstm.LSTM`` of ``layers`` layers, forward and
backward in float32:

* every candidate path (the kernels' ISA builds, each with its own GEMM or
  ``at::mm``, or with a forward's input projection in its steps) forced on
  every layer call through a cache file, and the paths timing picked from
  a fresh start (``chosen``: one per call shape, so a forward's and a
  backward's may differ), each training step timed, all run alternately:
  ``fastest`` is the quickest forced path, ``chosen / fastest`` the chosen
  paths' step time over the fastest's (at most 1.00: timing did at least
  as well as the best single path);
* ``steps`` training steps from a fresh start with the switch on (the
  trials inside) against the same steps on the chosen paths from the
  first, run alternately: ``cost`` is the first over the second, less 1.
"""

import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

import torch

from .. import _C
from ..backends import cpu
from ..lstm import LSTM
from . import report
from .table import Column, add_row, header
from .timing import interleaved_times, medians

__all__ = ["main"]

COLUMNS = [
    Column("threads", "threads"), Column("layers", "layers"), Column("T", "T"), Column("B", "B"), Column("H", "I=H"),
    Column("chosen", "chosen"), Column("fastest", "fastest"), Column("chosen_over_fastest", "chosen / fastest",
                                                                     "{:.2f}x"),
    Column("step_chosen", "step on chosen ms", "{:.2f}", 1e3), Column("step_default", "step on default ms",
                                                                      "{:.2f}", 1e3),
    Column("cost", "cost over the run", "{:+.1%}"),
]
# (T, B, H, layers)
SHAPES = [(32, 8, 64, 1), (32, 16, 256, 1), (64, 16, 256, 2), (32, 1, 512, 1), (32, 32, 512, 1)]
QUICK_SHAPES = [(8, 4, 16, 1)]


def _model(T: int, B: int, H: int, layers: int):
    torch.manual_seed(0)
    model = LSTM(H, H, num_layers=layers)
    x = torch.randn(T, B, H, requires_grad=True)

    def step():
        model(x)[0].sum().backward()
    return step


def _forced(cache: str, paths: Dict[str, str]) -> None:
    """Each call shape (a key of `paths`) on its path from the next call: a
    cache file naming them, read by a fresh chooser."""
    me = cpu.current_cpu()["microarchitecture"]
    with open(cache, "w") as f:
        f.writelines(f"{me}\t{key}\t{path}\n" for key, path in paths.items())
    _C._cpu_forget_chosen_paths()


def run(T: int, B: int, H: int, layers: int, threads: int, steps: int, repeats: int, cache: str) -> dict:
    torch.set_num_threads(threads)
    step = _model(T, B, H, layers)
    with cpu.flags(benchmark=True, benchmark_cache=""):
        _C._cpu_forget_chosen_paths()
        for _ in range(20):  # every layer call shape decided
            step()
        chosen = cpu.chosen_paths()
    picked = {c["shape"]: c["path"] for c in chosen}
    candidates = sorted({p for c in chosen for p in c["seconds"]})
    forced = {p: {key: p for key in picked} for p in candidates}

    def on(paths: Dict[str, str]):
        def one():
            _forced(cache, paths)
            step()  # the cache read, the buffers mapped
            start = time.perf_counter()
            for _ in range(5):
                step()
            return (time.perf_counter() - start) / 5
        return one

    with cpu.flags(benchmark=True, benchmark_cache=cache):
        times = interleaved_times({**{p: on(forced[p]) for p in candidates}, "chosen": on(picked)}, repeats)
    per_step = {p: statistics.median(v) for p, v in times.items()}
    fastest = min(candidates, key=per_step.get)
    # The cost: a fresh start with trials against the chosen paths from the first step.

    def from_scratch():
        with cpu.flags(benchmark=True, benchmark_cache=""):
            _C._cpu_forget_chosen_paths()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            return time.perf_counter() - start

    def already_chosen():
        with cpu.flags(benchmark=True, benchmark_cache=cache):
            _forced(cache, picked)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            return time.perf_counter() - start

    runs = interleaved_times({"scratch": from_scratch, "chosen": already_chosen}, repeats)
    med = medians(runs)
    default = cpu.current_isa() + ("/own" if cpu.current_gemm() == "own" else "/aten")
    return dict(threads=threads, layers=layers, T=T, B=B, H=H, chosen=", ".join(sorted(set(picked.values()))),
                fastest=fastest, chosen_over_fastest=per_step["chosen"] / per_step[fastest],
                step_chosen=per_step["chosen"],
                step_default=per_step.get(default), default=default, candidates={p: per_step[p] for p in candidates},
                run_from_scratch=med["scratch"], run_on_chosen=med["chosen"], cost=med["scratch"] / med["chosen"] - 1,
                samples=dict(candidates=times, runs=runs))


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("cpu_paths", __doc__, threads=(1, 2), repeats=5, quick=report.QUICK)
    p.add_argument("--steps", type=int, default=100, help="training steps of a run (default 100)")
    args = report.parse_arguments(p, argv)
    meta = report.metadata("cpu_paths", argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    steps = 10 if args.quick else args.steps
    me = cpu.current_cpu()
    print(f"torch {torch.__version__}, float32 CPU, {me['vendor']} family {me['family']} model {me['model']} "
          f"({me['microarchitecture']}), {report.isa_label()}; forward + backward; medians of {args.repeats} "
          f"alternating runs; a run of the cost {steps} steps", flush=True)
    print(header(COLUMNS), flush=True)
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as d:
        cache = os.path.join(d, "paths.tsv")
        for threads in args.threads:
            for T, B, H, layers in shapes:
                add_row(rows, COLUMNS, run(T, B, H, layers, threads, steps, args.repeats, cache))
    _C._cpu_forget_chosen_paths()
    report.write_json(args.json, meta, COLUMNS, rows, notes=[
        f"A run of the cost: {steps} training steps from a fresh chooser (its trials inside) against as many on "
        "the chosen paths from the first step. chosen / fastest compares per-step medians of the chosen paths and of "
        "every candidate forced on every call shape, all through a cache file; at most 1.00x: timing did at least "
        "as well as the best single path."])
    return rows
