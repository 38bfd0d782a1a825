"""Batches of a different length every step through the pipeline (packed
and padded): what the engine keeps per shape stays bounded -- the CPU buffer
cache keeps at most buffer_cache_mb of freed buffers and nothing stays in
use between steps, however many lengths have run -- and
examples/train_by_length.py, which groups batches by length, trains."""

import importlib.util
import random
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence, pad_sequence

import pipelstm
from pipelstm.backends import cpu

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
V = 300


@pytest.fixture
def small_cache():
    before = cpu.buffer_cache_mb
    cpu.buffer_cache_mb = 4
    yield 4 * 2**20
    cpu.buffer_cache_mb = before
    pipelstm.empty_cache()


@pytest.mark.parametrize("packed", [True, False])
def test_many_lengths_keep_the_buffer_cache_bounded(small_cache, packed):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, 32), pipelstm.LSTM(32, 64, num_layers=2), nn.Linear(64, V))
    pipe = pipelstm.Pipeline(model, ["cpu", "cpu"], chunks=3, micro_batches=2, threads=1,
                             loss_fn=nn.CrossEntropyLoss(ignore_index=0))
    rng = random.Random(0)
    in_use = []
    for T in rng.sample(range(5, 90), 40):  # 40 different lengths
        lengths = [rng.randint(1, T) for _ in range(15)] + [T]
        xs = [torch.randint(1, V, (n,)) for n in lengths]
        ys = [torch.randint(1, V, (n,)) for n in lengths]
        x, y = ((pack_sequence(xs, enforce_sorted=False), pack_sequence(ys, enforce_sorted=False)) if packed
                else (pad_sequence(xs), pad_sequence(ys)))
        loss, _ = pipe(x, target=y)
        loss.backward()
        del loss
        stats = pipelstm.memory_stats()
        assert stats["kept_bytes"] <= small_cache
        in_use.append(stats["in_use_bytes"])
    assert max(in_use[5:]) <= max(in_use[:5]) + small_cache  # nothing piles up per shape


def test_train_by_length_example_trains():
    spec = importlib.util.spec_from_file_location("train_by_length", EXAMPLES / "train_by_length.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "6", "--vocab", "200", "--emb", "8", "--hidden", "16", "--batch-size", "8"])
    assert len(result["lengths"]) > 1  # a different length from step to step
    assert all(loss == loss for loss in result["losses"]) and result["tokens"] > 0
    padded = example.main(["--steps", "6", "--vocab", "200", "--emb", "8", "--hidden", "16", "--batch-size", "8",
                           "--padded"])
    # the same batches and weights: packing changes what is computed, not the loss
    assert padded["losses"] == pytest.approx(result["losses"], rel=1e-5, abs=1e-5)
