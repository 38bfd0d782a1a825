"""``python -m pipelstm.bench persistent_steps``: the persistent kernels' own
timings, microseconds a step, as a result file.

The GPU check program of the persistent tensor-core kernels
(``kernels/tests/persistent_tc_gpu_check.cu``, run by
``kernels/tests/run_persistent_tc_gpu_check.sh`` and the ``tc`` step of
``tools/gpu_check.sh``) times each kernel alone at T = 100 (the median of 23
launches after 3 warm-ups, CUDA events around each launch) and prints one
``time ...`` line per shape. This command reads those lines from the
program's output (``--log``) and writes one row per shape and kernel: the
grid kernels (``tensor-core``, a grid barrier a step), and the cluster
kernels, each way of separating the forward's steps (``barrier``: the
cluster barrier; ``st.async``: stores counted on an mbarrier) at the
default cluster size and at 4, 8 and 16 blocks. A kernel that does not fit a
shape has no time.

    bash kernels/tests/run_persistent_tc_gpu_check.sh     # writes build/persistent_tc_gpu_check/check.log
    python -m pipelstm.bench persistent_steps --log build/persistent_tc_gpu_check/check.log --json steps.json

Run it on the machine that ran the check: the result file records this
machine and the device the log names.
"""

import math
import re
import sys
from typing import Dict, Iterable, List, Optional

from . import report
from .table import Column, add_row, header

__all__ = ["main", "parse"]

COLUMNS = [Column("dtype", "dtype"), Column("T", "T"), Column("B", "B"), Column("H", "H"),
           Column("kernel", "kernel"), Column("blocks", "blocks"),
           Column("forward_us", "forward µs a step", "{:.2f}"), Column("backward_us", "backward µs a step", "{:.2f}")]
SUMMARY_COLUMNS = [Column("dtype", "dtype"), Column("B", "B"), Column("H", "H"),
                   Column("grid_forward", "grid kernel forward µs", "{:.2f}"),
                   Column("best_forward", "fastest forward µs", "{:.2f}"), Column("best", "by"),
                   Column("grid_backward", "grid kernel backward µs", "{:.2f}"),
                   Column("best_backward", "fastest backward µs", "{:.2f}"), Column("best_bwd", "by")]

TIMES = re.compile(r"^time (?P<dtype>\w+) T=(?P<T>\d+) B=(?P<B>\d+) H=(?P<H>\d+), us a forward step: "
                   r"(?P<forward>[^;]*); a backward step: (?P<backward>.*)$")
ENTRY = re.compile(r"(?P<name>tensor-core|barrier|st\.async|cluster)(?:\((?P<blocks>\d+)\))? (?P<us>[-\w.]+)")
DEVICE = re.compile(r"^device (?P<name>.+?), (?P<sms>\d+) SMs")


def _entries(text: str) -> Iterable[tuple]:
    for m in ENTRY.finditer(text):
        us = float(m.group("us"))
        blocks = m.group("blocks")
        yield m.group("name"), ("default" if blocks == "0" else blocks or "grid"), (None if math.isnan(us) else us)


def parse(lines: Iterable[str]) -> Dict[str, object]:
    """The device line and one row per shape and kernel of the check
    program's output; raises ValueError when it has no timing line."""
    device: Optional[str] = None
    rows: List[dict] = []
    for line in lines:
        line = line.rstrip("\n")
        d = DEVICE.match(line)
        if d:
            device = d.group("name")
        m = TIMES.match(line)
        if not m:
            continue
        shape = dict(dtype=m.group("dtype"), T=int(m.group("T")), B=int(m.group("B")), H=int(m.group("H")))
        by_kernel: Dict[tuple, dict] = {}
        for part, side in (("forward", "forward_us"), ("backward", "backward_us")):
            for name, blocks, us in _entries(m.group(part)):
                kernel = {"tensor-core": "grid tensor-core", "barrier": "cluster barrier",
                          "st.async": "cluster st.async", "cluster": "cluster barrier"}[name]
                row = by_kernel.setdefault((kernel, blocks), dict(shape, kernel=kernel, blocks=blocks,
                                                                  forward_us=None, backward_us=None))
                row[side] = us
        rows.extend(by_kernel.values())
    if not rows:
        raise ValueError("no 'time ... us a forward step' line: is this the output of the persistent kernels' "
                         "GPU check (kernels/tests/run_persistent_tc_gpu_check.sh)?")
    return dict(device=device, rows=rows)


def summarize(rows: List[dict]) -> List[dict]:
    """Per shape: the grid kernel's times and the fastest kernel's, each way."""
    out = []
    shapes = sorted({(r["dtype"], r["B"], r["H"]) for r in rows})
    for dtype, B, H in shapes:
        mine = [r for r in rows if (r["dtype"], r["B"], r["H"]) == (dtype, B, H)]
        grid = next(r for r in mine if r["kernel"] == "grid tensor-core")
        row = dict(dtype=dtype, B=B, H=H, grid_forward=grid["forward_us"], grid_backward=grid["backward_us"])
        for side, best, by in (("forward_us", "best_forward", "best"), ("backward_us", "best_backward", "best_bwd")):
            timed = [r for r in mine if r[side] is not None]
            fastest = min(timed, key=lambda r: r[side]) if timed else None
            row[best] = fastest[side] if fastest else None
            row[by] = f"{fastest['kernel']} ({fastest['blocks']})" if fastest else "-"
        out.append(row)
    return out


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("persistent_steps", __doc__)
    p.add_argument("--log", required=True, help="the GPU check program's output (its check.log)")
    report.add_arguments(p)  # the repeats are the check program's own
    args = p.parse_args(argv)
    try:
        with open(args.log) as f:
            parsed = parse(f)
    except (OSError, ValueError) as e:
        p.error(f"--log: {e}")
    meta = report.metadata("persistent_steps", argv)
    meta["device"] = dict(name=parsed["device"] or "unknown (no 'device' line in the log)")
    rows: List[dict] = []
    print(header(COLUMNS))
    for row in parsed["rows"]:
        add_row(rows, COLUMNS, row)
    tables = [dict(title="Per shape: the grid kernel and the fastest", columns=SUMMARY_COLUMNS,
                   rows=summarize(rows))]
    report.print_tables(tables)
    notes = ["Each time is the median of 23 launches at T = 100 after 3 warm-ups, CUDA events around each launch "
             "(kernels/tests/persistent_tc_gpu_check.cu), divided by T. blocks: the cluster's (default: the smallest that "
             "fits); grid: the grid kernels' own. No time: the kernel does not fit the shape."]
    report.write_json(args.json, meta, COLUMNS, rows, tables=tables, notes=notes)
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
