"""examples/word_language_model.py runs unchanged with pipelstm.LSTM and
reproduces nn.LSTM's training run loss for loss."""

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "word_language_model.py"


def load_example():
    spec = importlib.util.spec_from_file_location("word_language_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["word_language_model"] = module  # torch.save pickles its classes by module name
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def corpus(tmp_path):
    # A small corpus with structure: words follow each other by a fixed rule
    # with some noise, so the loss can fall.
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(60)]

    def text(n_lines):
        lines = []
        for _ in range(n_lines):
            k = rng.randrange(60)
            words = []
            for _ in range(rng.randint(5, 15)):
                words.append(vocab[k])
                k = (k * 7 + 3) % 60 if rng.random() < 0.8 else rng.randrange(60)
            lines.append(" ".join(words))
        return "\n".join(lines)

    for name, n in (("train.txt", 400), ("valid.txt", 60), ("test.txt", 60)):
        (tmp_path / name).write_text(text(n))
    return tmp_path


def run(example, corpus, lstm, tmp_path):
    save = tmp_path / f"{lstm}.pt"
    torch.manual_seed(0)
    result = example.main([
        "--data", str(corpus), "--lstm", lstm, "--emsize", "16", "--nhid", "24", "--nlayers", "2",
        "--bptt", "10", "--batch-size", "8", "--max-batches", "12", "--epochs", "2", "--seed", "7",
        "--save", str(save), "--threads", "1",
    ])
    return result, save


def test_pipelstm_reproduces_nn_lstm_training(corpus, tmp_path):
    example = load_example()
    ref, _ = run(example, corpus, "nn", tmp_path)
    ours, saved = run(example, corpus, "pipelstm", tmp_path)
    assert len(ours["losses"]) == len(ref["losses"]) == 24
    for a, b in zip(ours["losses"], ref["losses"]):
        assert abs(a - b) <= 1e-4 * abs(b)
    for a, b in zip(ours["val_losses"], ref["val_losses"]):
        assert abs(a - b) <= 1e-4 * abs(b)
    assert ours["losses"][-1] < ours["losses"][0]
    model = torch.load(saved, weights_only=False)
    assert type(model.rnn).__module__.startswith("pipelstm")
