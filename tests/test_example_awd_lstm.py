"""examples/awd_lstm.py: the recipe on pipelstm.LSTM and on nn.LSTM starts
from the same weights and computes the same in evaluation; in training
both draw their masks; a short run learns and writes its JSON."""

import importlib.util
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    spec = importlib.util.spec_from_file_location("awd_lstm", os.path.join(ROOT, "examples", "awd_lstm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


awd = _example()
ARGS = dict(ntoken=50, emsize=8, nhid=12, nlayers=3, dropout_in=0.4, dropout_between=0.25, dropout_out=0.4,
            weight_dropout=0.5)


def _pair():
    models = []
    for kind in ("pipelstm", "nn"):
        torch.manual_seed(0)
        models.append(awd.AWDModel(kind, **ARGS))
    return models


def test_both_kinds_are_the_same_model_in_evaluation():
    ours, ref = (m.eval() for m in _pair())
    x = torch.randint(0, 50, (7, 3))
    out, (h, c) = ours(x, ours.init_hidden(3))
    want, (want_h, want_c) = ref(x, ref.init_hidden(3))
    for a, b in ((out, want), (h, want_h), (c, want_c)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_both_kinds_drop_while_training():
    for model in _pair():
        x = torch.randint(0, 50, (7, 3))
        a = model.train()(x, model.init_hidden(3))[0]
        b = model(x, model.init_hidden(3))[0]
        assert not torch.allclose(a, b)  # new masks each call
        a.sum().backward()


def test_the_nn_kind_without_weight_dropout_trains_and_evaluates():
    # F.dropout with p = 0 hands back the raw parameter itself; set on the
    # LSTM it became a parameter of its own, and evaluation then failed.
    torch.manual_seed(0)
    model = awd.AWDModel("nn", **dict(ARGS, weight_dropout=0.0))
    x = torch.randint(0, 50, (7, 3))
    model.train()(x, model.init_hidden(3))[0].sum().backward()
    model.eval()(x, model.init_hidden(3))
    assert [name for name, _ in model.named_parameters() if "weight_hh" in name] == \
        [f"rnns.{k}.weight_hh_raw" for k in range(3)]


def test_a_short_run_learns_and_writes_its_json(tmp_path):
    path = tmp_path / "run.json"
    run = awd.main(["--epochs", "2", "--max-batches", "12", "--emsize", "16", "--nhid", "32", "--threads", "1",
                    "--json", str(path)])
    assert json.loads(path.read_text()) == run
    first, second = (e["valid_ppl"] for e in run["epochs"])
    assert second < first and all(e["batches"] == 12 and e["seconds"] > 0 for e in run["epochs"])
