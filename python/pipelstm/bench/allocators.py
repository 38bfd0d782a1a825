"""``python -m pipelstm.bench allocators``: pipelstm's CPU buffer cache against
general-purpose allocators, on a training step.

pipelstm keeps freed CPU buffers of 1 MiB and more for the next call
(``PIPELSTM_BUFFER_CACHE_MB``, default 1024; docs/configuration.md). A user
could instead (or as well) run the process on jemalloc or tcmalloc
(``LD_PRELOAD``), which also keep freed memory. This bench runs the same
training step under each allocator (glibc's malloc, jemalloc, tcmalloc)
with the cache on (its default cap) and off, every configuration in a
process of its own that stays up (:class:`pipelstm.bench.groups.Group`),
the configurations taking turns, and reports each one's median step and
its peak resident memory's rise over the steps, against the default
(glibc, cache on).

Workloads: the language-model step of ``bench lm`` (embedding, 4 LSTM
layers, a decoder, cross-entropy; forward and backward) on
``pipelstm.LSTM`` with 2 intra-op threads, and as a 2-stage ``Pipeline``
of 1 thread each.

jemalloc and tcmalloc are Debian's ``libjemalloc2`` and
``libtcmalloc-minimal4`` (``apt-get install libjemalloc2
libtcmalloc-minimal4``); ``--allocators`` picks which to run, and one that
is asked for but not installed stops the bench with its package's name.
"""

import argparse
import contextlib
import os
import statistics
import sys
from typing import Dict, Iterator, List, Optional

from . import report
from .groups import STEPS_PER_TURN, Group, close_all, take_turns
from .lm import QUICK_SIZES, QUICK_VOCAB, SIZES, VOCAB, _LMWorkload, size_label
from .table import Column, markdown
from .timing import spread

__all__ = ["ALLOCATORS", "setup_workload", "main"]

MIB = 1 / 2**20

# Allocator name -> (the library LD_PRELOAD loads, the Debian package holding it).
ALLOCATORS = {
    "glibc": (None, None),
    "jemalloc": ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
}
WORKLOADS = {"pipelstm.LSTM 2 threads": dict(kind="pipelstm.LSTM", threads=2),
             "Pipeline 2 stages x 1 thread": dict(kind="pipeline", chunks=4, micro_batches=2)}

COLUMNS = [
    Column("workload", "workload"), Column("allocator", "allocator"), Column("cache", "buffer cache"),
    Column("seconds", "step (s), median", "{:.3f}"), Column("spread", "min-max (s)"),
    Column("speed", "default / this", "{:.2f}x"), Column("rise_mib", "peak rise (MiB)", "{:.0f}"),
    Column("rise_of_default", "rise / default's", "{:.2f}x"),
]


class _Workload:
    """One configuration's training step, and which allocator the process runs."""

    def __init__(self, **kwargs) -> None:
        self._step = _LMWorkload(**kwargs)

    def step(self) -> None:
        self._step.step()

    def info(self) -> dict:
        with open("/proc/self/maps") as f:
            maps = f.read()
        return dict(loaded=[name for name, (lib, _) in ALLOCATORS.items()
                            if lib is not None and os.path.basename(lib) in maps])


def setup_workload(rank: int, world: int, **kwargs) -> _Workload:
    """A :class:`pipelstm.bench.groups.Group` workload."""
    return _Workload(**kwargs)


def _put(values: Dict[str, Optional[str]]) -> None:
    """Sets ``values`` in os.environ; None unsets."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def _environment(**values: Optional[str]) -> Iterator[None]:
    """os.environ with ``values`` set (None: unset) while processes are spawned."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _put(values)
        yield
    finally:
        _put(saved)


def _library(name: str) -> Optional[str]:
    lib, package = ALLOCATORS[name]
    if lib is not None and not os.path.exists(lib):
        sys.exit(f"bench allocators: {name} needs {lib} (Debian package {package}: apt-get install {package}), "
                 f"or leave it out with --allocators")
    return lib


def main(argv: Optional[List[str]] = None) -> List[dict]:
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench allocators", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"the small sizes of bench lm ({size_label(QUICK_SIZES[0])})")
    ap.add_argument("--reps", type=int, default=7, help="timed steps per configuration (median; at least 5)")
    ap.add_argument("--allocators", nargs="+", choices=list(ALLOCATORS), default=list(ALLOCATORS))
    ap.add_argument("--cache-mb", type=int, default=1024, help="the buffer cache's cap when on (its default)")
    args = report.parse_arguments(ap, argv, "--reps")
    if "glibc" not in args.allocators:
        ap.error("--allocators must include glibc: it is the baseline")
    meta = report.metadata("allocators", argv)
    size, vocab = (QUICK_SIZES[0], QUICK_VOCAB) if args.quick else (SIZES[0], VOCAB)
    libraries = {name: _library(name) for name in args.allocators}
    timeout = 120.0 if args.quick else 1800.0
    configs = []  # (row, group)
    try:
        for workload, kw in WORKLOADS.items():
            for name in args.allocators:
                for cache in (args.cache_mb, 0):
                    row = dict(workload=workload, allocator=name, cache="off" if cache == 0 else f"{cache} MiB")
                    with _environment(LD_PRELOAD=libraries[name], PIPELSTM_BUFFER_CACHE_MB=str(cache)):
                        group = Group(f"{workload}, {name}, cache {row['cache']}", 1, setup_workload,
                                      timeout=timeout, vocab=vocab, **size, **kw)
                    configs.append((row, group))
        print(f"LM step at {size_label(size)}, vocab {vocab}: {len(configs)} configurations, {args.reps} turns "
              f"each after a warm-up turn ({STEPS_PER_TURN} steps a turn, the last one timed)", flush=True)
        times, logs = take_turns([g for _, g in configs], args.reps)
    finally:
        close_all([g for _, g in configs])

    rows = []
    for i, (row, _) in enumerate(configs):
        samples = times[str(i)]
        last = logs[i][-1][0]
        expected = [] if row["allocator"] == "glibc" else [row["allocator"]]
        if last["loaded"] != expected:
            raise RuntimeError(f"bench allocators: {row}: the process runs {last['loaded'] or 'glibc'}, "
                               f"not {row['allocator']} (LD_PRELOAD did not take)")
        row.update(seconds=statistics.median(samples), spread=spread(samples), samples=samples,
                   rise_mib=(last["peak_bytes"] - last["start_bytes"]) * MIB)
        rows.append(row)
    defaults: Dict[str, dict] = {r["workload"]: r for r in rows
                                 if r["allocator"] == "glibc" and r["cache"] != "off"}
    for r in rows:
        d = defaults[r["workload"]]
        r.update(speed=d["seconds"] / r["seconds"], rise_of_default=r["rise_mib"] / max(d["rise_mib"], 1.0))
    notes = [f"LM step of bench lm at {size_label(size)}, vocab {vocab}, 4 LSTM layers. Each configuration in a "
             f"process of its own, all in turns of {STEPS_PER_TURN} steps (the last one timed); the median of "
             f"{args.reps} turns. Default = glibc's malloc with the buffer cache on ({args.cache_mb} MiB). Peak "
             "rise: the process's peak resident set over the steps (VmHWM) above its resident set before the "
             "first step, measured by the kernel."]
    print(markdown(COLUMNS, rows))
    report.write_json(args.json, meta, COLUMNS, rows, notes=notes)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
