"""python -m pipelstm.bench packed: a PackedSequence through the pipeline against the padded batch.

One language-model training step (Embedding -> LSTM layers -> decoder ->
cross-entropy inside the last stage, forward + backward) of a 2-stage
in-process ``pipelstm.Pipeline`` (one thread per stage), on a batch of
sentences whose lengths are drawn from a corpus:

* packed: the batch as a ``PackedSequence`` (``enforce_sorted=False``):
  every stage computes only the sentences' real tokens;
* padded: the same sentences padded to the longest, ``[T, B]``, the padding
  ignored by the loss (``ignore_index``): every stage computes on it.

The lengths are those of the sentences of WikiText-2's validation split
(``--data DIR`` holding ``valid.txt``) or, without ``--data``, of the corpus
the examples use (pydoc's topics, as words): the result names which. Both
sides take turns step by step in one process (``timing.interleaved_times``),
medians of ``--reps`` steps after a warm-up, a fresh batch of sentences
every step (the same batches on both sides).
"""

import argparse
import copy
import os
import random
import re
import statistics
import sys
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence, pad_sequence

from .. import LSTM, Pipeline
from . import report
from .table import Column, markdown
from .timing import interleaved_times, spread

__all__ = ["sentence_lengths", "main"]

PAD = 0


def sentence_lengths(data: Optional[str]) -> Tuple[List[int], str]:
    """Words per sentence of a corpus and its name: WikiText-2's
    ``valid.txt`` in ``data``, else pydoc's topics. Sentences end at `` . ``
    (WikiText's tokenisation) or ``. ``."""
    if data is not None:
        with open(os.path.join(data, "valid.txt"), encoding="utf8") as f:  # headings (" = ... = ") left out
            lines = [line.strip() for line in f if line.strip() and not line.strip().startswith("=")]
        name = "WikiText-2 validation sentences (valid.txt)"
        parts = [p for line in lines for p in re.split(r" \. ", line)]
    else:
        from pydoc_data.topics import topics

        text = "\n".join(topics[k] for k in sorted(topics))
        name = "pydoc topics sentences (the examples' corpus)"
        parts = re.split(r"\.\s", text)
    lengths = [len(p.split()) + 1 for p in parts]  # + the end of the sentence
    return [n for n in lengths if n >= 2], name


def _batches(lengths: Sequence[int], batch: int, max_len: int, count: int, vocab: int, seed: int):
    """``count`` batches of ``batch`` sentences of lengths drawn from ``lengths``
    (capped at ``max_len``), random tokens, as (inputs, targets) lists."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ns = [min(rng.choice(lengths), max_len) for _ in range(batch)]
        xs = [torch.randint(1, vocab, (n,), generator=g) for n in ns]
        ys = [torch.randint(1, vocab, (n,), generator=g) for n in ns]
        out.append((xs, ys))
    return out


class _Step:
    """One training step of a pipeline over a list of batches, one batch per call."""

    def __init__(self, pipe: Pipeline, batches, packed: bool) -> None:
        self.pipe, self.i = pipe, 0
        if packed:
            self.data = [(pack_sequence(xs, enforce_sorted=False), pack_sequence(ys, enforce_sorted=False))
                         for xs, ys in batches]
        else:
            self.data = [(pad_sequence(xs, padding_value=PAD), pad_sequence(ys, padding_value=PAD))
                         for xs, ys in batches]

    def __call__(self) -> None:
        x, y = self.data[self.i % len(self.data)]
        self.i += 1
        self.pipe.zero_grad(set_to_none=True)
        loss, _ = self.pipe(x, target=y)
        loss.backward()


COLUMNS = [
    Column("side", "input"), Column("tokens", "tokens computed per step"),
    Column("seconds", "step (s), median", "{:.4f}"), Column("spread", "min-max (s)"),
    Column("speedup", "packed speedup", "{:.2f}x"),
]


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench packed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="a folder with WikiText-2's valid.txt (default: pydoc's topics)")
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--emb", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="sentences per batch")
    ap.add_argument("--max-len", type=int, default=128, help="longer sentences are cut to this")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7, help="timed steps per side (median; at least 5)")
    ap.add_argument("--quick", action="store_true", help="fewer steps allowed (a smoke test)")
    args = report.parse_arguments(ap, argv, "--reps")
    meta = report.metadata("packed", argv)
    lengths, corpus = sentence_lengths(args.data)
    batches = _batches(lengths, args.batch, args.max_len, 4, args.vocab, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(args.vocab, args.emb), LSTM(args.emb, args.hidden, num_layers=args.layers),
                          nn.Linear(args.hidden, args.vocab))
    models = {"packed": model, "padded": copy.deepcopy(model)}  # the same weights on both sides
    pipes = {side: Pipeline(m, ["cpu", "cpu"], chunks=args.chunks, micro_batches=args.micro_batches, threads=1,
                            loss_fn=nn.CrossEntropyLoss(ignore_index=PAD)) for side, m in models.items()}
    steps = {side: _Step(pipe, batches, side == "packed") for side, pipe in pipes.items()}
    real = statistics.mean(sum(len(x) for x in xs) for xs, _ in batches)
    padded = statistics.mean(max(len(x) for x in xs) * len(xs) for xs, _ in batches)
    print(f"lengths: {corpus}, {len(lengths)} sentences, mean {statistics.mean(lengths):.1f}, median "
          f"{statistics.median(lengths)}, cut at {args.max_len}; {args.batch} per batch: {real:.0f} tokens, "
          f"{padded:.0f} padded", flush=True)
    times = interleaved_times(steps, args.reps, warmup=2)
    med = {side: statistics.median(ts) for side, ts in times.items()}
    rows = [dict(side=side, tokens=round(real if side == "packed" else padded), seconds=med[side],
                 spread=spread(times[side]), samples=times[side], speedup=med["padded"] / med[side])
            for side in ("packed", "padded")]
    model_text = (f"Embedding({args.vocab}, {args.emb}) -> {args.layers} x LSTM(H={args.hidden}) -> "
                  f"Linear({args.hidden}, {args.vocab}) -> cross-entropy in the last stage")
    notes = [f"Model: {model_text}; pipelstm.Pipeline, 2 CPU stages x 1 thread, K={args.chunks}, "
             f"M={args.micro_batches}; one training step (forward + backward) per run.",
             f"Sentence lengths: {corpus} ({len(lengths)} sentences, mean {statistics.mean(lengths):.1f} words, "
             f"median {statistics.median(lengths)}, cut at {args.max_len}); batches of {args.batch} sentences "
             f"drawn at random, {real:.0f} real tokens against {padded:.0f} padded on average (padding ratio "
             f"{padded / real:.2f}).",
             f"Medians of {args.reps} steps, the two sides taking turns step by step in one process, cycling "
             f"through the same {len(batches)} batches; packed speedup = padded median / packed median."]
    print(markdown(COLUMNS, rows))
    for note in notes:
        print(note)
    report.write_json(args.json, meta, COLUMNS, rows, notes=notes, corpus=corpus, stage_threads=[1, 1],
                      padding_ratio=padded / real)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
