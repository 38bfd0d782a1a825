"""``python -m pipelstm.bench grid``: pipelstm.LSTM against torch.nn.LSTM over a grid of sizes.

Both modules get the same weights (``load_state_dict``) and the same input
(I = H, fp32, time-major), and are timed alternately in one process, run by
run; each row reports the medians and their ratio nn/ours (> 1: pipelstm is
faster). Modes: ``fwd``, forward only, modules in eval mode under
``torch.no_grad()`` (inference); ``fwdbwd``, forward and backward of the
output's sum (training mode, the input requires grad).

The default grid covers every value of every axis without the whole cross
product, which a small machine cannot run:

* 1 layer, dense input: every H x B x T of H in {64, 128, 256, 512, 1024},
  B in {1, 8, 32, 64}, T in {32, 128};
* 4 layers, ``bidirectional``, ``proj_size`` = H/2 and packed input
  (``PackedSequence``, lengths uniform in [T/2, T], against nn.LSTM on the
  same packed batch and on the same batch padded) at three representative
  sizes, (H, B, T) = (64, 8, 128), (256, 32, 128), (512, 64, 128);
* each at 1 and 2 intra-op threads, in both modes.

``--H/--B/--T`` run every selected variant over the H x B x T given;
``--full`` runs every variant and layer count over the whole grid.
``--budget-seconds`` skips (and lists) the rows whose estimated time is
larger. Where the arithmetic dominates (H >= 512, B >= 32) a row also gives
its GEMM FLOP rate as a fraction of a large square ``torch.mm``'s at the
same threads, the mm timed in the same rounds as the two modules (a third
side of the interleaving), so that a machine that slows down or speeds up
during the run moves both alike. A run of a call under ``--min-run-ms``
(20 ms) is the mean of as many back-to-back calls as fill it (the count
fixed per side from one warm call, the warm-up that many calls too): timed
one call a run, a 0.1 ms row's medians moved by 25 % between runs, and its
first calls in a fresh process are slower than the rest. At the end: the
geometric mean and the worst ratio per (threads, mode), a packed row
counting with the lower of its two ratios.
"""

import gc
import itertools
import math
import sys
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from ..backends import cpu as cpu_backend
from ..lstm import LSTM
from . import report
from .table import Column, header, markdown, row_line
from .timing import add_min_run_argument, gemm_gflops, interleaved_times, medians

__all__ = ["Case", "cases", "flops", "estimate_seconds", "measure", "summarize", "main"]

VARIANTS = ("dense", "bidirectional", "proj", "packed")
MODES = ("fwd", "fwdbwd")
GRID = dict(H=[64, 128, 256, 512, 1024], B=[1, 8, 32, 64], T=[32, 128])
REPRESENTATIVE = [(64, 8, 128), (256, 32, 128), (512, 64, 128)]  # (H, B, T) of the variants
QUICK_GRID = dict(H=[16, 512], B=[1, 32], T=[4])
QUICK_REPRESENTATIVE = [(16, 32, 4)]
LARGE = dict(H=512, B=32)  # rows at least this large report the fraction of torch.mm's rate


@dataclass(frozen=True)
class Case:
    """One shape: input variant, layers and sizes (I = H)."""

    variant: str
    layers: int
    H: int
    B: int
    T: int

    @property
    def proj_size(self) -> int:
        return self.H // 2 if self.variant == "proj" else 0

    @property
    def directions(self) -> int:
        return 2 if self.variant == "bidirectional" else 1

    @property
    def large(self) -> bool:
        return self.H >= LARGE["H"] and self.B >= LARGE["B"]


def cases(H: Sequence[int], B: Sequence[int], T: Sequence[int], layers: Sequence[int], variants: Sequence[str],
          representative: Sequence[Tuple[int, int, int]], *, layers_given: bool, sizes_given: bool,
          full: bool) -> List[Case]:
    """The shapes to run: dense 1-layer over H x B x T; any other (variant,
    layers) at the representative sizes, unless sizes were given or ``full``.
    Variants other than dense run with 1 layer unless ``layers`` were given."""
    grid = list(itertools.product(H, B, T))
    out = []
    for variant in variants:
        for L in layers:
            if variant != "dense" and L != 1 and not (layers_given or full):
                continue
            if (variant, L) == ("dense", 1) or sizes_given or full:
                sizes = grid
            else:
                sizes = [s for s in representative if s[0] in H and s[1] in B and s[2] in T] or []
            out += [Case(variant, L, h, b, t) for h, b, t in sizes]
    return out


def flops(case: Case, tokens: int, mode: str) -> float:
    """FLOPs of the LSTM's GEMMs over ``tokens`` (time steps x sequences);
    forward + backward counts the backward as twice the forward."""
    H, P, D = case.H, case.proj_size or case.H, case.directions
    per_token = 0.0
    for layer in range(case.layers):
        I = H if layer == 0 else P * D
        per_token += D * (2 * 4 * H * (I + P) + (2 * H * P if case.proj_size else 0))
    return per_token * tokens * (3 if mode == "fwdbwd" else 1)


def estimate_seconds(case: Case, mode: str, gemm: float, runs: int, min_run: float = 0.0) -> float:
    """A rough upper estimate of a row's time: every side's GEMMs at half of
    torch.mm's rate plus 30 µs per layer, direction and step (the nn.LSTM
    packed path counted 4 times dense)."""
    one = flops(case, case.T * case.B, mode) / (0.5 * gemm * 1e9)
    one += 30e-6 * case.T * case.layers * case.directions * (1 if mode == "fwd" else 2)
    sides = 6 if case.variant == "packed" else 2
    return max(one, min_run) * sides * runs


def _inputs(case: Case, train: bool):
    """(input for both modules, padded batch for nn.LSTM or None, tokens)."""
    x = torch.randn(case.T, case.B, case.H)
    if case.variant != "packed":
        return x.requires_grad_(train), None, case.T * case.B
    lengths = torch.randint(case.T // 2, case.T + 1, (case.B,))
    seq = pack_padded_sequence(x, lengths, enforce_sorted=False)
    seq.data.requires_grad_(train)
    return seq, x.requires_grad_(train), int(lengths.sum())


# Calls enough for every layer call shape's trials with
# pipelstm.backends.cpu.benchmark on: one untimed, then two on each of up
# to four paths.
CHOICE_CALLS = 1 + 2 * 4


def measure(case: Case, mode: str, repeats: int, mm_size: Optional[int] = None, min_run: float = 0.0) -> dict:
    """Times one row at the current thread count: ours, nn.LSTM on the same
    input and, for packed input, nn.LSTM on the padded batch; with
    ``mm_size``, also a square torch.mm of that size in the same rounds
    (its rate in ``gemm``, GFLOP/s)."""
    torch.manual_seed(0)
    kw = dict(num_layers=case.layers, bidirectional=case.directions == 2, proj_size=case.proj_size)
    peer = nn.LSTM(case.H, case.H, **kw)
    ours = LSTM(case.H, case.H, **kw)
    ours.load_state_dict(peer.state_dict())
    train = mode == "fwdbwd"
    peer.train(train)
    ours.train(train)
    inp, padded, tokens = _inputs(case, train)

    def side(model, x):
        if not train:
            def run():
                with torch.no_grad():
                    model(x)
            return run

        def run():
            out = model(x)[0]
            (out.data if isinstance(out, PackedSequence) else out).sum().backward()
        return run

    fns = {"ours": side(ours, inp), "peer": side(peer, inp)}
    if padded is not None:
        fns["padded"] = side(peer, padded)
    if mm_size is not None:
        a, b = torch.randn(mm_size, mm_size), torch.randn(mm_size, mm_size)
        fns["mm"] = lambda: torch.mm(a, b)
    before = {p["shape"] for p in cpu_backend.chosen_paths()}
    if cpu_backend.benchmark:  # its timed trials before the timed runs
        for _ in range(CHOICE_CALLS):
            fns["ours"]()
    times = interleaved_times(fns, repeats, min_run_seconds=min_run)
    med = medians(times)
    chosen = sorted({p["path"] for p in cpu_backend.chosen_paths() if p["shape"] not in before})
    row = dict(asdict(case), proj_size=case.proj_size, mode=mode, tokens=tokens, ours=med["ours"], peer=med["peer"],
               ratio=med["peer"] / med["ours"], padded=med.get("padded"),
               ratio_padded=med["padded"] / med["ours"] if "padded" in med else None,
               samples={k: v for k, v in times.items()}, cpu_paths=", ".join(chosen) or None)
    row["gflops"] = flops(case, tokens, mode) / med["ours"] / 1e9
    if mm_size is not None:
        row["gemm"] = 2 * mm_size**3 / med["mm"] / 1e9
    return row


def _strict(row: dict) -> float:
    """The row's ratio for the summary: the lower of its ratios."""
    return min(r for r in (row["ratio"], row.get("ratio_padded")) if r is not None)


def summarize(rows: Sequence[dict]) -> List[dict]:
    """Per (threads, mode): rows, geometric mean and worst of the ratios, rows at >= 1.0x."""
    out = []
    for key in sorted({(r["threads"], r["mode"]) for r in rows}):
        group = [r for r in rows if (r["threads"], r["mode"]) == key]
        ratios = [_strict(r) for r in group]
        worst = min(group, key=_strict)
        large = [r["of_mm"] for r in group if r.get("of_mm") is not None]
        out.append(dict(threads=key[0], mode=key[1], rows=len(group),
                        geomean=math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
                        worst=_strict(worst), worst_row=_label(worst), at_least_1=sum(x >= 1.0 for x in ratios),
                        of_mm_min=min(large) if large else None))
    return out


def _label(r: dict) -> str:
    return f"{r['variant']} L={r['layers']} H={r['H']} B={r['B']} T={r['T']}"


COLUMNS = [
    Column("threads", "threads"), Column("mode", "mode"), Column("variant", "variant"), Column("layers", "layers"),
    Column("H", "H"), Column("B", "B"), Column("T", "T"),
    Column("ours", "pipelstm ms", "{:.2f}", 1e3), Column("peer", "nn.LSTM ms", "{:.2f}", 1e3),
    Column("ratio", "nn/ours", "{:.2f}x"),
    Column("padded", "nn.LSTM padded ms", "{:.2f}", 1e3), Column("ratio_padded", "padded/ours", "{:.2f}x"),
    Column("of_mm", "of mm", "{:.2f}"),
    Column("cpu_paths", "paths chosen"),
]
SUMMARY_COLUMNS = [
    Column("threads", "threads"), Column("mode", "mode"), Column("rows", "rows"),
    Column("geomean", "geometric mean nn/ours", "{:.2f}x"), Column("worst", "worst", "{:.2f}x"),
    Column("worst_row", "worst row"), Column("at_least_1", "rows >= 1.0x"),
    Column("of_mm_min", "lowest of mm (H>=512, B>=32)", "{:.2f}"),
]
SKIPPED_COLUMNS = [Column("threads", "threads"), Column("mode", "mode"), Column("variant", "variant"),
                   Column("layers", "layers"), Column("H", "H"), Column("B", "B"), Column("T", "T"),
                   Column("estimate", "estimated s", "{:.0f}")]


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("grid", __doc__, threads=(1, 2), repeats=5, per="side", quick=report.QUICK)
    p.add_argument("--H", type=int, nargs="+", default=None, help="hidden sizes (= input sizes)")
    p.add_argument("--B", type=int, nargs="+", default=None, help="batch sizes")
    p.add_argument("--T", type=int, nargs="+", default=None, help="sequence lengths")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layer counts (default 1 4)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--full", action="store_true", help="every variant and layer count over the whole H x B x T")
    add_min_run_argument(p)
    p.add_argument("--budget-seconds", type=float, default=300.0,
                   help="skip rows estimated to take longer than this (0: no limit)")
    args = report.parse_arguments(p, argv)
    meta = report.metadata("grid", argv)
    grid = QUICK_GRID if args.quick else GRID
    todo = cases(args.H or grid["H"], args.B or grid["B"], args.T or grid["T"], args.layers or [1, 4],
                 args.variants, QUICK_REPRESENTATIVE if args.quick else REPRESENTATIVE,
                 layers_given=args.layers is not None,
                 sizes_given=any(v is not None for v in (args.H, args.B, args.T)), full=args.full)
    isa = report.isa_label()
    print(f"pipelstm.LSTM vs torch.nn.LSTM, torch {torch.__version__}, fp32, I=H, {meta['machine']['cpu']}, "
          f"{isa}; median of {args.repeats} interleaved runs after 1 warm-up, a run of a short call the mean of "
          f"as many calls as fill {args.min_run_ms:g} ms; nn/ours > 1: pipelstm faster; "
          f"{len(todo)} shapes x {len(args.threads)} thread counts x {len(args.modes)} modes", flush=True)
    gemm = {}
    for n_threads in args.threads:
        torch.set_num_threads(n_threads)
        gemm[n_threads] = gemm_gflops(n=256 if args.quick else 2048)
    runs = args.repeats + 1
    min_run = args.min_run_ms / 1e3
    plan = [(t, case, mode, estimate_seconds(case, mode, gemm[t], runs, min_run))
            for t in args.threads for case in todo for mode in args.modes]
    budget = args.budget_seconds or math.inf
    print(f"estimated at most {sum(e for *_, e in plan if e <= budget) / 60:.0f} min "
          f"(--budget-seconds {args.budget_seconds:g} skips {sum(e > budget for *_, e in plan)} rows)", flush=True)
    rows, skipped = [], []
    print(header(COLUMNS), flush=True)
    for n_threads, case, mode, est in plan:
        torch.set_num_threads(n_threads)
        if est > budget:
            skipped.append(dict(asdict(case), threads=n_threads, mode=mode, estimate=est))
            continue
        mm_size = (256 if args.quick else 2048) if case.large else None
        row = dict(threads=n_threads, gemm=gemm[n_threads], isa=isa)
        row.update(measure(case, mode, args.repeats, mm_size, min_run))  # its own gemm where large
        row["of_mm"] = row["gflops"] / row["gemm"] if case.large else None
        rows.append(row)
        print(row_line(COLUMNS, row), flush=True)
        gc.collect()  # the modules and their inputs, before the next row
    summary = summarize(rows) if rows else []
    print("\n" + markdown(SUMMARY_COLUMNS, summary), flush=True)
    notes = [f"torch.mm rate ({'256' if args.quick else '2048'}^2 fp32) at the start: "
             + ", ".join(f"{t} thread{'s' * (t > 1)} {g:.1f} GFLOP/s" for t, g in gemm.items())
             + "; 'of mm' divides by the mm rate timed in the row's own rounds",
             "A packed row counts in the summary with the lower of its two ratios (vs nn.LSTM packed, vs padded)."]
    if skipped:
        print(f"\nskipped {len(skipped)} rows estimated over --budget-seconds {args.budget_seconds:.0f}:")
        print(markdown(SKIPPED_COLUMNS, skipped), flush=True)
        notes.append(f"{len(skipped)} rows skipped, estimated over --budget-seconds {args.budget_seconds:.0f}.")
    for line in notes:
        print(line)
    if args.json:
        tables = [dict(title="Per threads and mode", columns=SUMMARY_COLUMNS, rows=summary)]
        if skipped:
            tables.append(dict(title="Skipped (estimated too slow)", columns=SKIPPED_COLUMNS, rows=skipped))
        report.write_json(args.json, meta, COLUMNS, rows, tables=tables, notes=notes, skipped=skipped,
                          gemm_gflops={str(t): g for t, g in gemm.items()})
    return rows
