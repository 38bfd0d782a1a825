"""``python -m pipelstm.bench lm``: the language-model training step at equal cores.

One training step of a word-level language model, Embedding(V, H) ->
4 x LSTM(H, H) -> Linear(H, V): forward, cross-entropy over all T*B
tokens (mean) against random targets, backward; input and targets are
random token ids, time-major ``[T, B]``. Two sizes, H=256 B=16 T=128 and
H=512 B=32 T=128, vocabulary ``--vocab`` (10000; ``--quick``: tiny sizes,
vocabulary 1000).

For each size, one turn of each of these in turn (after a warm-up turn
each), every figure the median of ``--reps`` turns:

* the model on ``torch.nn.LSTM``, one process with ``--threads`` intra-op
  threads (``torch.set_num_threads``; 1 and 2);
* the same model on ``pipelstm.LSTM`` (the weights copied from the
  nn.LSTM model through ``state_dict``), at the same thread counts;
* ``pipelstm.Pipeline`` of the pipelstm model over ``devices=["cpu",
  "cpu"]``, 2 stages of 1 thread each, for every K (``--chunks``) x M
  (``--micro-batches``), the loss computed as the pipeline's last unit
  (``loss_fn=nn.CrossEntropyLoss()``, ``loss, _ = pipe(x, target=y)``).

Every configuration runs in a process of its own that stays up for the
whole size (:class:`pipelstm.bench.groups.Group`), and the processes take
turns, the others blocked meanwhile: each model has its process to
itself, as a user's training script would. (With all of them in one
process, nn.LSTM's steps had run up to 1.5x slower than alone, after the
pipelines' steps; pipelstm's, whose large buffers come from its own cache
of kept mappings, had not.) A turn is ``STEPS_PER_TURN`` steps in a row,
the last one timed inside its process: the step of a training loop, which
follows the same model's step.

One thread per stage stands in for one device per stage: the 2 stages are
2 threads of one process, one core each. What a CPU user would run instead
is the same model as one process with 2 intra-op threads: nn.LSTM with 2
threads is the equal-cores baseline, and every row's ratio is its time
over that row's (>1: faster than nn.LSTM on the same cores). The 1-thread
rows are for reference. The summary gives, per size, pipelstm.LSTM with 2
threads and the best of {pipelstm.LSTM with 2 threads, the best K x M of
2 stages x 1 thread} against the baseline, and the best 2 stages against
pipelstm.LSTM on 1 thread (what the second core buys the same model).
"""

import argparse
import copy
import statistics
import sys
from collections import OrderedDict
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import LSTM, Pipeline
from . import report
from .groups import STEPS_PER_TURN, Group, close_all, take_turns
from .pipeline import PipelineStep
from .pipelining_peer import LanguageModel
from .table import Column, header, row_line
from .timing import median_index, spread

__all__ = ["SIZES", "QUICK_SIZES", "ModelStep", "main"]

SIZES = [dict(H=256, B=16, T=128), dict(H=512, B=32, T=128)]
QUICK_SIZES = [dict(H=32, B=4, T=16), dict(H=64, B=8, T=16)]
LAYERS = 4
STAGES = 2  # the pipeline's stages, one thread each: the equal-cores baseline has this many threads
VOCAB, QUICK_VOCAB = 10_000, 1000
BASELINE = "nn.LSTM"


def size_label(s: Dict[str, int]) -> str:
    return f"H={s['H']} B={s['B']} T={s['T']}"


class ModelStep:
    """One training step of ``model`` at ``threads`` intra-op threads; the
    caller's thread count is restored after it, so steps at different thread
    counts can alternate in one process."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, threads: int) -> None:
        self.model, self.x, self.y, self.threads = model, x, y, threads  # x, y: [T, B]

    def __call__(self) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self.model.zero_grad(set_to_none=True)
            logits = self.model(self.x)
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1)).backward()
        finally:
            torch.set_num_threads(previous)


def as_sequential(model: LanguageModel) -> nn.Sequential:
    """A copy of ``model`` as the ``nn.Sequential`` a Pipeline takes (same state_dict keys)."""
    return nn.Sequential(OrderedDict((name, copy.deepcopy(getattr(model, name)))
                                     for name in ("embedding", "lstm", "decoder")))


COLUMNS = [
    Column("size", "size"), Column("config", "configuration"), Column("threads", "threads"),
    Column("K", "K"), Column("M", "M"), Column("seconds", "step (s), median", "{:.3f}"),
    Column("spread", "min-max (s)"), Column("ratio", f"{BASELINE} {STAGES} threads / this", "{:.2f}x"),
]
SUMMARY_COLUMNS = [
    Column("size", "size"), Column("baseline", f"{BASELINE} {STAGES} threads (s)", "{:.3f}"),
    Column("ours", f"pipelstm.LSTM {STAGES} threads (s)", "{:.3f}"), Column("ours_ratio", "ratio", "{:.2f}x"),
    Column("best_K", "best K"), Column("best_M", "best M"),
    Column("pipe", f"best {STAGES} stages x 1 thread (s)", "{:.3f}"), Column("pipe_ratio", "ratio", "{:.2f}x"),
    Column("best_ratio", "best of both", "{:.2f}x"),
    Column("pipe_vs_one", f"best {STAGES} stages vs pipelstm.LSTM 1 thread", "{:.2f}x"),
]


class _LMWorkload:
    """One configuration's model and its training step, in a process of its own
    (a :class:`pipelstm.bench.groups.Group` workload): ``kind`` is BASELINE or
    "pipelstm.LSTM" (at ``threads`` intra-op threads) or "pipeline" (2
    stages of 1 thread, ``chunks`` x ``micro_batches``)."""

    def __init__(self, kind: str, H: int, B: int, T: int, vocab: int, threads: int = 1, chunks: int = 1,
                 micro_batches: int = 1) -> None:
        torch.manual_seed(0)  # the same weights in every process
        peer = LanguageModel(vocab, H, H, LAYERS, lstm=nn.LSTM)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, vocab, (T, B), generator=g)
        y = torch.randint(0, vocab, (T, B), generator=g)
        self.pipeline: Optional[PipelineStep] = None
        if kind == BASELINE:
            self._step = ModelStep(peer, x, y, threads)
            return
        ours = LanguageModel(vocab, H, H, LAYERS, lstm=LSTM)
        ours.load_state_dict(peer.state_dict())
        del peer
        if kind == "pipeline":
            pipe = Pipeline(as_sequential(ours), devices=["cpu"] * STAGES, chunks=chunks,
                            micro_batches=micro_batches, threads=1, loss_fn=nn.CrossEntropyLoss())
            self.balance = list(pipe.balance)
            # PipelineStep takes the target [B, T] and passes its [T, B] view
            self.pipeline = self._step = PipelineStep(pipe, x, y.t())
        else:
            self._step = ModelStep(ours, x, y, threads)

    def step(self) -> None:
        self._step()

    def info(self) -> dict:
        """The pipeline's figures of the last step (busy, bubbles), and its balance."""
        if self.pipeline is None:
            return {}
        return dict(self.pipeline.runs[-1], balance=self.balance)


def setup_config(rank: int, world: int, **kwargs) -> _LMWorkload:
    """A :class:`pipelstm.bench.groups.Group` workload: one configuration of one size."""
    if world != 1:
        raise ValueError(f"a configuration is one process, not {world}")
    return _LMWorkload(**kwargs)


def run_size(s: Dict[str, int], vocab: int, threads: List[int], chunks: List[int], micro_batches: List[int],
             reps: int) -> List[dict]:
    """The rows of one size, each configuration in a process of its own, all timed in one interleaved loop."""
    H, B, T = s["H"], s["B"], s["T"]
    label = size_label(s)
    model = dict(H=H, B=B, T=T, vocab=vocab)
    rows: List[dict] = []  # one per configuration, beside its group
    groups: List[Group] = []
    try:
        for kind in (BASELINE, "pipelstm.LSTM"):
            for n in threads:
                rows.append(dict(size=label, config=f"{kind} model, 1 process x {n} thread{'s' * (n > 1)}",
                                 kind=kind, threads=n, cores=n))
                groups.append(Group(rows[-1]["config"], 1, setup_config, kind=kind, threads=n, **model))
        for K in chunks:
            for M in micro_batches:
                rows.append(dict(size=label, kind="pipeline", threads="1 per stage", cores=STAGES, K=K, M=M))
                groups.append(Group(f"pipeline K={K} M={M}", 1, setup_config, kind="pipeline", chunks=K,
                                    micro_batches=M, **model))
        times, infos = take_turns(groups, reps)
    finally:
        close_all(groups)

    for i, row in enumerate(rows):
        samples = times[str(i)]
        row.update(H=H, B=B, T=T, vocab=vocab, layers=LAYERS, seconds=statistics.median(samples),
                   spread=spread(samples), samples=samples)
        if row["kind"] == "pipeline":  # figures of the median step itself (infos[i][0]: the warm-up turn's)
            run = infos[i][1:][median_index(samples)][0]  # its one rank
            row["config"] = f"pipelstm.Pipeline, {STAGES} stages {run['balance']} x 1 thread"
            row.update(busy=run["busy"], bubble=run["bubble"], theory=run["theory"])
    base = next(r for r in rows if r["kind"] == BASELINE and r["threads"] == STAGES)["seconds"]
    for r in rows:
        r["ratio"] = base / r["seconds"]
    return rows


def summarize(rows: List[dict]) -> List[dict]:
    """Per size: pipelstm.LSTM with 2 threads and the best 2-stage pipeline against nn.LSTM with 2 threads."""
    summary = []
    for label in dict.fromkeys(r["size"] for r in rows):
        mine = [r for r in rows if r["size"] == label]
        base = next(r for r in mine if r["kind"] == BASELINE and r["threads"] == STAGES)
        ours = next(r for r in mine if r["kind"] == "pipelstm.LSTM" and r["threads"] == STAGES)
        pipes = [r for r in mine if r["kind"] == "pipeline"]
        best = min(pipes, key=lambda r: r["seconds"]) if pipes else None
        one = next((r for r in mine if r["kind"] == "pipelstm.LSTM" and r["threads"] == 1), None)
        summary.append(dict(
            size=label, baseline=base["seconds"], ours=ours["seconds"], ours_ratio=ours["ratio"],
            best_K=best and best["K"], best_M=best and best["M"], pipe=best and best["seconds"],
            pipe_ratio=best and best["ratio"], best_ratio=max(ours["ratio"], best["ratio"] if best else 0.0),
            pipe_vs_one=one["seconds"] / best["seconds"] if best and one else None,
        ))
    return summary


def summary_line(s: dict) -> str:
    return (f"{s['size']}: pipelstm.LSTM {STAGES} threads: {s['ours_ratio']:.2f}x {BASELINE}; best of "
            f"{{pipelstm.LSTM {STAGES} threads, {STAGES} stages x 1 thread}}: {s['best_ratio']:.2f}x")


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench lm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes (H=32 B=4 T=16, H=64 B=8 T=16; vocab 1000), to check that the bench runs")
    ap.add_argument("--vocab", type=int, default=None, help=f"vocabulary size V (default {VOCAB}; --quick: "
                                                            f"{QUICK_VOCAB})")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, STAGES],
                    help=f"intra-op threads of the nn.LSTM and pipelstm.LSTM models ({STAGES}, the equal-cores "
                         "baseline, is always included)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16], help="pipeline K values to try")
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2], help="pipeline M values to try")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per configuration (median; at least 5)")
    args = report.parse_arguments(ap, argv, "--reps")
    for flag, values in (("--threads", args.threads), ("--chunks", args.chunks),
                         ("--micro-batches", args.micro_batches)):
        if any(v < 1 for v in values):
            ap.error(f"{flag} values must be at least 1")
    vocab = args.vocab if args.vocab is not None else (QUICK_VOCAB if args.quick else VOCAB)
    if vocab < 1:
        ap.error("--vocab must be at least 1")
    threads = sorted(set(args.threads) | {STAGES})
    meta = report.metadata("lm", argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    model = f"Embedding({vocab}, H) -> {LAYERS} x LSTM(H, H) -> Linear(H, {vocab})"
    print(f"torch {torch.__version__}, fp32 CPU, {report.isa_label()}; model: {model}; one training step (forward, "
          f"cross-entropy over all T*B tokens, backward); median of {args.reps} steps, each configuration in a "
          f"process of its own, all of a size in turns of {STEPS_PER_TURN} steps, the last timed. One thread per "
          f"stage stands in for one device per stage; {BASELINE} with {STAGES} "
          "threads is the equal-cores baseline.", flush=True)
    print(header(COLUMNS), flush=True)
    rows = []
    for s in sizes:
        new = run_size(s, vocab, threads, args.chunks, args.micro_batches, args.reps)
        for r in new:
            print(row_line(COLUMNS, r), flush=True)
        rows += new
    summary = summarize(rows)
    lines = [summary_line(s) for s in summary]
    notes = [f"Model: {model}, random token ids, time-major [T, B]; one training step = forward, mean "
             "cross-entropy over all T*B tokens, backward. The pipelines compute the loss as their last unit.",
             f"One thread per stage stands in for one device per stage; {BASELINE} with {STAGES} intra-op threads "
             f"in one process is the equal-cores baseline, and ratio = its step time / this one's (>1: faster "
             "on the same cores). The 1-thread rows are for reference.",
             f"Every step time is the median of {args.reps} steps, timed in the configuration's own process; the "
             f"configurations of a size, each a process of its own, take turns of {STEPS_PER_TURN} steps in a row, "
             "the last one timed."] + lines
    tables = [dict(title="Summary", columns=SUMMARY_COLUMNS, rows=summary)]
    report.print_tables(tables)
    print()
    for line in lines:
        print(line)
    report.write_json(args.json, meta, COLUMNS, rows, notes=notes, tables=tables)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
