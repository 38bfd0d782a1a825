"""examples/word_language_model.py runs unchanged with pipelstm.LSTM and
reproduces nn.LSTM's training run loss for loss; it needs no data outside
the repository."""

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # torch.save pickles the example's classes by module name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load("word_language_model")


def write_corpus(folder, names=("train.txt", "valid.txt", "test.txt")):
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

    for name in names:
        (folder / name).write_text(text(400 if name == "train.txt" else 60))
    return folder


SMALL = ["--emsize", "16", "--nhid", "24", "--nlayers", "2", "--bptt", "10", "--batch-size", "8", "--threads", "1",
         "--log-interval", "1000"]


def test_pipelstm_reproduces_nn_lstm_training(example, tmp_path):
    corpus = write_corpus(tmp_path)
    results = {}
    for lstm in ("nn", "pipelstm"):
        torch.manual_seed(0)  # the script must seed itself: this must not matter
        results[lstm] = example.main([
            "--data", str(corpus), "--lstm", lstm, *SMALL, "--max-batches", "6", "--epochs", "2", "--seed", "7",
            "--dropout", "0.2", "--save", str(tmp_path / f"{lstm}.pt"), "--loss-log", str(tmp_path / f"{lstm}.json"),
        ])
    ref, ours = results["nn"], results["pipelstm"]
    assert len(ours["losses"]) == len(ref["losses"]) == 12
    for a, b in zip(ours["losses"] + ours["val_losses"], ref["losses"] + ref["val_losses"]):
        assert abs(a - b) <= 1e-4 * abs(b)
    assert ours["losses"][-1] < ours["losses"][0]
    assert json.loads((tmp_path / "pipelstm.json").read_text())["losses"] == ours["losses"]

    # The saved models load and are the classes that were trained.
    for lstm, cls in (("nn", torch.nn.LSTM), ("pipelstm", __import__("pipelstm").LSTM)):
        model = torch.load(tmp_path / f"{lstm}.pt", weights_only=False)
        assert type(model.rnn) is cls
        assert model.rnn.dropout == 0.2  # --dropout reaches the LSTM too, as in pytorch/examples
    # and a pipelstm checkpoint's weights load into the nn.LSTM model.
    ours_model = torch.load(tmp_path / "pipelstm.pt", weights_only=False)
    ref_model = torch.load(tmp_path / "nn.pt", weights_only=False)
    ref_model.load_state_dict(ours_model.state_dict(), strict=True)


def test_embedded_corpus_needs_no_data(example, monkeypatch, capsys):
    args = example.parse_args([])
    assert args.data is None

    def no_files(*a, **kw):
        raise AssertionError(f"the embedded corpus opened a file: {a}")

    monkeypatch.setattr(example, "open", no_files, raising=False)  # the script's own open()
    # The corpus is pydoc's topics, token for token: every non-blank line's
    # words and an <eos>, split into train, valid and test in that order.
    from pydoc_data.topics import topics

    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    words = [w for line in lines for w in line.split() + ["<eos>"]]
    corpus = example.Corpus(None)
    parts = (corpus.train, corpus.valid, corpus.test)
    assert [corpus.dictionary.idx2word[i] for i in torch.cat(parts).tolist()] == words
    assert len(corpus.train) > 0.7 * len(words) and min(len(corpus.valid), len(corpus.test)) > 0.05 * len(words)

    # Trained on it, pipelstm.LSTM reproduces nn.LSTM loss for loss.
    results = {}
    for lstm in ("nn", "pipelstm"):
        results[lstm] = example.main(["--lstm", lstm, *SMALL, "--max-batches", "3", "--eval-batches", "2"])
        assert f"{lstm} LSTM, {len(corpus.dictionary)} words" in capsys.readouterr().out
    ref, ours = results["nn"], results["pipelstm"]
    assert len(ours["losses"]) == len(ref["losses"]) == 3 and len(ours["val_losses"]) == 1
    for a, b in zip(ours["losses"] + ours["val_losses"], ref["losses"] + ref["val_losses"]):
        assert abs(a - b) <= 1e-4 * abs(b), (a, b)


def test_missing_train_txt_falls_back_to_valid_txt(example, tmp_path):
    write_corpus(tmp_path, names=("valid.txt", "test.txt"))
    corpus = example.Corpus(str(tmp_path))

    def tokens(name):  # the file's words, an <eos> after every line
        return [w for line in (tmp_path / name).read_text().splitlines() for w in line.split() + ["<eos>"]]

    def words(ids):
        return [corpus.dictionary.idx2word[i] for i in ids.tolist()]

    assert tokens("valid.txt") != tokens("test.txt")
    assert words(corpus.train) == tokens("valid.txt")  # train.txt is missing: valid.txt trains
    assert words(corpus.valid) == tokens("test.txt")  # and test.txt validates
    assert words(corpus.test) == tokens("test.txt")


def test_lockstep_comparison(tmp_path):
    lockstep = load("word_language_model_lockstep")
    corpus = write_corpus(tmp_path)
    result = lockstep.main(["--data", str(corpus), *SMALL, "--max-batches", "5"])
    summary = result["summary"]
    assert summary["batches"] == 5
    assert summary["max_loss_rel"] <= 1e-5 and summary["max_grad_rel"] <= 1e-4


def test_onnx_export_runs_in_onnxruntime_as_eager(example, tmp_path, capsys):
    # --onnx-export as in pytorch/examples: with pipelstm.LSTM the model
    # exports, and onnxruntime computes what the eager model computes (and
    # what the same weights in nn.LSTM compute).
    ort = pytest.importorskip("onnxruntime", reason="the ONNX export check needs onnxruntime (requirements-dev.txt)")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript (requirements-dev.txt)")
    corpus = write_corpus(tmp_path)
    onnx_path, saved = tmp_path / "model.onnx", tmp_path / "model.pt"
    example.main(["--data", str(corpus), "--lstm", "pipelstm", *SMALL, "--max-batches", "3", "--eval-batches", "1",
                  "--save", str(saved), "--onnx-export", str(onnx_path)])
    assert f"exported in ONNX format at {onnx_path}" in capsys.readouterr().out

    model = torch.load(saved, weights_only=False).eval()
    assert type(model.rnn).__module__ == "pipelstm.lstm"
    ref = example.RNNModel(torch.nn.LSTM, model.encoder.num_embeddings, 16, 24, 2, 0.2, 0.2).eval()
    ref.load_state_dict(model.state_dict())
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    bptt = 10  # SMALL's --bptt: the exported sequence length, batch 1
    tokens = torch.randint(0, model.encoder.num_embeddings, (bptt, 1))
    hidden = (torch.randn(2, 1, 24), torch.randn(2, 1, 24))
    feed = dict(zip([i.name for i in session.get_inputs()], (tokens.numpy(), hidden[0].numpy(), hidden[1].numpy())))
    got = session.run(None, feed)
    for eager in (model, ref):
        with torch.no_grad():
            logits, (h, c) = eager(tokens, hidden)
        for g, w in zip(got, (logits, h, c)):
            torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-5, rtol=1e-4)
