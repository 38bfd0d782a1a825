"""The AWD-LSTM-style example (examples/awd_lstm.py) on pipelstm.LSTM against
the same recipe on nn.LSTM with the weight-drop wrapper: each kind with each
seed, the two kinds taking turns per seed (or side by side, with --jobs 2),
the same epochs; the validation perplexity after the last epoch and the
time per epoch, as a bench JSON (docs/bench/awd_*.json render in
docs/regularisation.md).

    python tools/awd_compare.py --data path/to/wikitext-2 --seeds 1 2 3 --epochs 6 --json docs/bench/awd.json

Each run is deterministic for its seed and thread count, so --jobs changes
the times per epoch (runs share the machine), not the perplexities.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from pipelstm.bench import report  # noqa: E402
from pipelstm.bench.table import Column  # noqa: E402

COLUMNS = [Column("seed", "seed"), Column("lstm", "LSTM"), Column("valid_ppl", "valid ppl", "{:.2f}"),
           Column("epoch_seconds", "s / epoch (median)", "{:.1f}")]
SUMMARY = [Column("lstm", "LSTM"), Column("ppl", "valid ppl (mean over seeds)", "{:.2f}"),
           Column("epoch_seconds", "s / epoch (median)", "{:.1f}"), Column("vs_nn", "vs nn.LSTM + weight drop")]


def _command(args, seed: int, kind: str, out: str) -> list:
    cmd = [sys.executable, os.path.join(ROOT, "examples", "awd_lstm.py"), "--lstm", kind, "--seed", str(seed),
           "--epochs", str(args.epochs), "--threads", str(args.threads), "--json", out]
    if args.data:
        cmd += ["--data", args.data]
    for name in ("max_batches", "eval_batches", "nhid"):
        if getattr(args, name):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return cmd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batches", type=int, default=None, help="each epoch's training batches at most")
    ap.add_argument("--eval-batches", type=int, default=None, help="each validation's batches at most")
    ap.add_argument("--nhid", type=int, default=None, help="the LSTM's hidden size (default: the example's)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once (2: each seed's two kinds side by side, e.g. --threads 1 on 2 cores)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    meta = report.metadata("awd", sys.argv[1:] if argv is None else argv, program="tools/awd_compare.py")
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    runs = [(seed, kind) for seed in args.seeds for kind in ("pipelstm", "nn")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for first in range(0, len(runs), args.jobs):
            batch = runs[first:first + args.jobs]
            procs = [subprocess.Popen(_command(args, seed, kind, os.path.join(tmp, f"{kind}-{seed}.json")))
                     for seed, kind in batch]
            codes = [proc.wait() for proc in procs]
            for (seed, kind), code in zip(batch, codes):
                if code != 0:
                    raise SystemExit(f"awd_compare: the {kind} run with seed {seed} failed (exit {code})")
                run = json.load(open(os.path.join(tmp, f"{kind}-{seed}.json")))
                rows.append(dict(seed=seed, lstm=kind, valid_ppl=run["epochs"][-1]["valid_ppl"],
                                 epoch_seconds=statistics.median(e["seconds"] for e in run["epochs"]),
                                 epochs=run["epochs"]))
    summary = []
    for kind in ("pipelstm", "nn"):
        mine = [r for r in rows if r["lstm"] == kind]
        summary.append(dict(lstm=kind, ppl=statistics.mean(r["valid_ppl"] for r in mine),
                            epoch_seconds=statistics.median(r["epoch_seconds"] for r in mine)))
    ours, peer = summary
    ours["vs_nn"] = (f"ppl {ours['ppl'] / peer['ppl'] - 1:+.1%}, "
                     f"{peer['epoch_seconds'] / ours['epoch_seconds']:.2f}x faster")
    for row in summary:
        print(row)
    corpus = os.path.basename(os.path.normpath(args.data)) if args.data else "its embedded corpus"
    report.write_json(args.json, meta, COLUMNS, rows, tables=[dict(title="Summary", columns=SUMMARY, rows=summary)],
                      notes=[f"examples/awd_lstm.py on {corpus}, {args.epochs} epochs"
                             f"{f' of {args.max_batches} batches' if args.max_batches else ''}"
                             f"{f', validated on {args.eval_batches} batches' if args.eval_batches else ''}"
                             f"{f', nhid {args.nhid}' if args.nhid else ''}, {args.threads} threads, "
                             f"{f'{args.jobs} runs at once, ' if args.jobs > 1 else ''}"
                             f"seeds "
                             f"{args.seeds}; nn: nn.LSTM layers each with the weight-drop wrapper, locked dropout "
                             "between them; both from the same initial weights per seed."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
