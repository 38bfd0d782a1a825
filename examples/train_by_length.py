"""Train a sentence-level LSTM language model with batches grouped by length, through the pipeline.

    python examples/train_by_length.py                      # pydoc's topics, packed batches
    python examples/train_by_length.py --padded             # the same batches padded instead
    python examples/train_by_length.py --data DIR           # train.txt of PTB / WikiText (word-level)

The sentences of the corpus are sorted by length and cut into batches of
``--batch-size`` sentences of about the same length (bucketing), visited in
a random order: every step has a different length T. Each batch goes through
a 2-stage ``pipelstm.Pipeline`` (one thread per stage) with the loss inside
the last stage, as a ``PackedSequence`` (no stage computes on padding) or,
with ``--padded``, padded to its longest sentence (the padding ignored by
the loss). The engine keeps nothing per shape; the CPU buffer cache keeps at
most ``pipelstm.backends.cpu.buffer_cache_mb`` of freed buffers, whatever
the lengths: the run ends with its counters.
"""

import argparse
import os
import random
import re
import time
from typing import List, Optional

import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence, pad_sequence

import pipelstm

PAD = 0  # token 0 is padding; words are 1..V


def sentences(data: Optional[str], min_len: int, max_len: int) -> List[List[str]]:
    """The corpus as sentences of words (pydoc's topics, or ``data``/train.txt), ``min_len``..``max_len`` long."""
    if data is None:
        from pydoc_data.topics import topics

        parts = re.split(r"\.\s", "\n".join(topics[k] for k in sorted(topics)))
    else:
        with open(os.path.join(data, "train.txt"), encoding="utf8") as f:
            parts = [p for line in f if line.strip() and not line.strip().startswith("=")
                     for p in re.split(r" \. ", line.strip())]
    out = [p.split() + ["<eos>"] for p in parts]
    return [s for s in out if min_len <= len(s) <= max_len]


def length_batches(sents: List[List[int]], batch_size: int, seed: int) -> List[List[List[int]]]:
    """Batches of ``batch_size`` sentences of about the same length, in a random order."""
    ordered = sorted(sents, key=len)
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered) - batch_size + 1, batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


def as_input(batch: List[List[int]], padded: bool):
    """(input, target) of a batch: each sentence predicts its next word."""
    xs = [torch.tensor(s[:-1]) for s in batch]
    ys = [torch.tensor(s[1:]) for s in batch]
    if padded:
        return pad_sequence(xs, padding_value=PAD), pad_sequence(ys, padding_value=PAD)
    return pack_sequence(xs, enforce_sorted=False), pack_sequence(ys, enforce_sorted=False)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="folder with train.txt (default: pydoc's topics)")
    ap.add_argument("--padded", action="store_true", help="pad each batch instead of packing it")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=80)
    ap.add_argument("--vocab", type=int, default=5000, help="the most frequent words; the rest share one token")
    ap.add_argument("--emb", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    words = sentences(args.data, args.min_len + 1, args.max_len + 1)
    counts = {}
    for s in words:
        for w in s:
            counts[w] = counts.get(w, 0) + 1
    common = sorted(counts, key=lambda w: -counts[w])[: args.vocab - 2]
    index = {w: i + 2 for i, w in enumerate(common)}  # 0: padding, 1: any other word
    batches = length_batches([[index.get(w, 1) for w in s] for s in words], args.batch_size, args.seed)
    V = len(common) + 2
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Embedding(V, args.emb), pipelstm.LSTM(args.emb, args.hidden, num_layers=args.layers),
                          nn.Linear(args.hidden, V))
    pipe = pipelstm.Pipeline(model, ["cpu", "cpu"], chunks=args.chunks, micro_batches=args.micro_batches, threads=1,
                             loss_fn=nn.CrossEntropyLoss(ignore_index=PAD))
    optimizer = torch.optim.Adam(pipe.parameters(), lr=args.lr)
    print(f"{len(words)} sentences, {len(batches)} batches of {args.batch_size} grouped by length; vocab {V}; "
          f"{'padded' if args.padded else 'packed'} input; balance {pipe.balance}", flush=True)
    lengths, losses, tokens = set(), [], 0
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = as_input(batches[step % len(batches)], args.padded)
        lengths.add(int(x.batch_sizes.numel()) if not args.padded else x.size(0))
        tokens += int((y.data if not args.padded else y).ne(PAD).sum())
        optimizer.zero_grad(set_to_none=True)
        loss, _ = pipe(x, target=y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % 20 == 0 or step + 1 == args.steps:
            rate = tokens / (time.perf_counter() - start)
            print(f"step {step + 1:>5} | loss {sum(losses[-20:]) / len(losses[-20:]):6.3f} | {rate:7.0f} tok/s | "
                  f"{len(lengths)} different lengths so far", flush=True)
    stats = pipelstm.memory_stats()
    print(f"CPU buffer cache: {stats['kept_bytes'] / 2**20:.1f} MiB kept (at most "
          f"{pipelstm.backends.cpu.buffer_cache_mb} MiB), {stats['mapped_bytes'] / 2**20:.1f} MiB mapped, "
          f"{stats['hits']} hits, {stats['misses']} misses", flush=True)
    return dict(losses=losses, lengths=sorted(lengths), memory=stats, tokens=tokens)


if __name__ == "__main__":
    main()
