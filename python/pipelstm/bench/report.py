"""Benchmark result files: one JSON file per run, saying what produced it.

Every bench command takes ``--json PATH`` and writes::

    {"bench": "grid", "command": "python -m pipelstm.bench grid ...",
     "columns": [...], "rows": [...], "tables": [...], "notes": [...],
     "machine": {"cpu": ..., "isa": {...}, "cores": ..., "threads": ...},
     "versions": {"torch": ..., "python": ..., "pipelstm": ...},
     "commit": "<sha>[-dirty]" or null, "date": "<ISO 8601, UTC>"}

``columns`` describe how ``rows`` show as a markdown table (see
:mod:`pipelstm.bench.table`); ``tables`` holds further tables (a summary,
per-stage memory) in the same form. ``python -m pipelstm.bench docs``
turns these files into the tables of docs/bench/*.md and the headlines
of README.md and docs/benchmarks.md.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
from typing import Dict, Mapping, Optional, Sequence

import torch

from .table import Column, columns_to_json, markdown

__all__ = [
    "ISA_ENV",
    "cpu_model",
    "isa",
    "isa_label",
    "machine",
    "versions",
    "git_commit",
    "command",
    "metadata",
    "add_arguments",
    "check_repeats",
    "parse_arguments",
    "print_tables",
    "write_json",
    "read_json",
]

# Environment variables that cap or pick the instruction set of oneDNN, MKL,
# ATen's own kernels and pipelstm's kernels (and what runs its GEMMs).
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "PIPELSTM_CPU_ISA",
           "PIPELSTM_CPU_GEMM", "PIPELSTM_CPU_BENCHMARK")
# glibc's cap on malloc's per-thread arenas and the cap of pipelstm's cache
# of kept mappings (docs/cpu.md, "Memory"): they change the resident-set
# figures of `bench distributed` (docs/benchmarks.md) and the speed of every
# step, so they are recorded beside the ISA caps.
MEMORY_ENV = ("MALLOC_ARENA_MAX", "PIPELSTM_BUFFER_CACHE_MB")
MIN_REPEATS = 5


def cpu_model() -> Optional[str]:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _pipelstm_isa(name: str = "cpu_isa") -> Optional[str]:
    """``pipelstm._C.<name>()`` (``cpu_isa``, ``cpu_gemm``), where this build has it."""
    try:
        from .. import _C
    except ImportError:
        return None
    fn = getattr(_C, name, None)
    if fn is None:
        return None
    try:
        return str(fn())
    except Exception as e:  # noqa: BLE001  (metadata must not stop a run)
        return f"error: {e}"


def isa() -> Dict[str, object]:
    """The instruction set actually used: ATen's CPU capability, pipelstm's
    (``_C.cpu_isa()``, None where the build lacks it), what runs its
    whole-batch GEMMs (``_C.cpu_gemm()``: own or aten) and the environment
    variables of ISA_ENV and MEMORY_ENV that are set."""
    return dict(aten=torch.backends.cpu.get_cpu_capability(), pipelstm=_pipelstm_isa(),
                gemm=_pipelstm_isa("cpu_gemm"),
                env={k: os.environ[k] for k in ISA_ENV + MEMORY_ENV if k in os.environ})


def isa_label(info: Optional[Mapping] = None) -> str:
    """A short description, e.g. ``ATen AVX2, pipelstm avx2 (ONEDNN_MAX_CPU_ISA=AVX2)``."""
    info = isa() if info is None else info
    text = f"ATen {info.get('aten')}"
    if info.get("pipelstm") is not None:
        text += f", pipelstm {info['pipelstm']}"
    if info.get("gemm") is not None:
        text += f" (GEMMs: {info['gemm']})"
    env = info.get("env") or {}
    if env:
        text += " (" + " ".join(f"{k}={v}" for k, v in env.items()) + ")"
    return text


def cpu_class() -> Optional[Dict[str, object]]:
    """The CPU's vendor, family/model and microarchitecture class as the
    kernels see them (``pipelstm.backends.cpu.current_cpu()``), where this
    build has it."""
    try:
        from ..backends import cpu

        return cpu.current_cpu()
    except (ImportError, AttributeError):
        return None


def machine() -> Dict[str, object]:
    """CPU model and class, ISA, logical cores and torch's intra-op threads now."""
    return dict(cpu=cpu_model(), cpu_class=cpu_class(), isa=isa(), cores=os.cpu_count(),
                threads=torch.get_num_threads())


def versions() -> Dict[str, str]:
    from .._version import __version__

    return dict(torch=torch.__version__, python=platform.python_version(), pipelstm=__version__)


def git_commit(path: Optional[str] = None) -> Optional[str]:
    """``git rev-parse HEAD`` of the checkout holding ``path`` (default: this
    package's source), with ``-dirty`` when the tree has changes; None outside
    a checkout (e.g. an installed wheel). ``$PIPELSTM_SOURCE_COMMIT``, where
    set, comes first: a copy of the tree (the one a lent GPU machine gets,
    whose ``.git``, if any, is not this tree's) names the commit it was
    copied from."""
    if os.environ.get("PIPELSTM_SOURCE_COMMIT"):
        return os.environ["PIPELSTM_SOURCE_COMMIT"]
    path = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", path, *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", "__init__.py")  # a tracked source file, not a copy inside the tree
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def command(bench: str, argv: Sequence[str]) -> str:
    """The command line that ran the bench, as a user would type it."""
    return shlex.join(["python", "-m", "pipelstm.bench", bench, *argv])


def metadata(bench: str, argv: Sequence[str], program: Optional[str] = None) -> Dict[str, object]:
    """Everything but the results; take it when the run starts. ``program``: the script that ran, where it
    is not ``python -m pipelstm.bench BENCH`` (e.g. ``tools/awd_compare.py``)."""
    cmd = shlex.join(["python", program, *argv]) if program else command(bench, argv)
    return dict(bench=bench, command=cmd, machine=machine(), versions=versions(),
                commit=git_commit(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


QUICK = "tiny sizes, to check that the benchmark runs"


def argument_parser(bench: str, description: Optional[str], *, threads: Optional[Sequence[int]] = None,
                    repeats: Optional[int] = None, per: str = "row", quick: Optional[str] = None
                    ) -> argparse.ArgumentParser:
    """A bench's parser (``python -m pipelstm.bench BENCH``), with the options most benches share where asked
    for: ``--threads`` (default ``threads``), ``--repeats`` (timed runs per ``per``, default ``repeats``) and
    ``--quick`` (a flag whose help is ``quick``, e.g. :data:`QUICK`)."""
    parser = argparse.ArgumentParser(prog=f"python -m pipelstm.bench {bench}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if threads is not None:
        parser.add_argument("--threads", type=int, nargs="+", default=list(threads))
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats,
                            help=f"timed runs per {per} (median reported; at least 5)")
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``, common to every bench."""
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the results, the command and the machine to this JSON file")


def check_repeats(parser: argparse.ArgumentParser, repeats: int, quick: bool, flag: str = "--repeats") -> None:
    """Medians need at least MIN_REPEATS timed runs (fewer only with --quick)."""
    if repeats < 1 or (repeats < MIN_REPEATS and not quick):
        parser.error(f"{flag} must be at least {MIN_REPEATS} (the median of fewer runs is not reported; "
                     f"--quick allows fewer)")


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str],
                    repeats_flag: str = "--repeats") -> argparse.Namespace:
    """Every bench's command line: adds ``--json``, parses ``argv`` and checks the repeat count.

    Args:
        parser: the bench's parser, with its own options (``--quick`` where it has one).
        argv: the command line after the bench's name.
        repeats_flag: the bench's option for the number of timed runs (``--repeats`` or ``--reps``).

    Returns:
        The parsed arguments.

    Raises:
        SystemExit: through ``parser.error`` for a bad command line or too few repeats
            (see :func:`check_repeats`).
    """
    add_arguments(parser)
    args = parser.parse_args(argv)
    repeats = getattr(args, repeats_flag.lstrip("-").replace("-", "_"))
    check_repeats(parser, repeats, getattr(args, "quick", False), repeats_flag)
    return args


def print_tables(tables: Sequence[Mapping]) -> None:
    """Prints further tables, as :func:`write_json` takes them (``dict(title=..., columns=..., rows=...)``),
    each after a blank line, so that what a run shows and what its file keeps come from one list."""
    for t in tables:
        print()
        print(markdown(t["columns"], t["rows"]))


def _clean(value):
    """JSON-safe: NaN/inf as null, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Optional[str], meta: Mapping, columns: Sequence[Column], rows: Sequence[Mapping], *,
               tables: Sequence[Mapping] = (), notes: Sequence[str] = (), **fields) -> Optional[str]:
    """Writes one result file (atomically) and returns its path; with no path (a bench run without
    ``--json``), writes nothing and returns None.

    ``tables``: further tables, each ``dict(title=..., columns=[Column...], rows=[...])``;
    ``notes``: lines printed under the tables; ``fields``: anything else to keep.
    """
    if not path:
        return None
    data = dict(meta)
    data.update(columns=columns_to_json(columns), rows=list(rows),
                tables=[dict(title=t.get("title", ""), columns=columns_to_json(t["columns"]), rows=list(t["rows"]))
                        for t in tables],
                notes=list(notes))
    data.update(fields)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(_clean(data), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    print(f"results written to {path}", flush=True)
    return path


def read_json(path: str) -> dict:
    """One result file; raises ValueError if a required field is missing."""
    with open(path) as f:
        data = json.load(f)
    missing = [k for k in ("bench", "command", "columns", "rows", "machine", "versions", "commit", "date")
               if k not in data]
    if missing:
        raise ValueError(f"{path}: not a pipelstm bench result (missing {', '.join(missing)})")
    return data
