"""python -m pipelstm.bench small: both sides of a row are the same model,
the bench runs and writes its JSON, and its headline names each module."""

import json

import pytest
import torch

from pipelstm.bench import small, summary


@pytest.mark.parametrize("module", ["LSTM", "LSTMCell"])
def test_both_sides_compute_the_same_model(module):
    ours, peer = small._models(module, 2, 8)
    x = torch.randn(3, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(small._forward(module, ours, x), small._forward(module, peer, x))


def test_a_timed_training_call_runs_the_backward():
    ours, _ = small._models("LSTMCell", 1, 8)
    small._call("LSTMCell", ours, torch.randn(3, 2, 8), training=True)()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ours.parameters())


def test_quick_run_writes_every_column_and_a_headline_per_module(tmp_path):
    path = tmp_path / "r.json"
    rows = small.main(["--quick", "--threads", "1", "--repeats", "3", "--min-run-ms", "1", "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["bench"] == "small" and len(rows) == 2 * len(small.QUICK_CASES)
    assert {r["mode"] for r in rows} == {"inference", "training"}
    for row, saved in zip(rows, data["rows"]):
        assert row["ours"] > 0 and row["peer"] > 0 and saved["speedup"] == row["speedup"]
    headlines = summary.summary_rows(data, "page.md")
    assert [h["what"].split()[0] for h in headlines] == ["`pipelstm.LSTM`", "`pipelstm.LSTMCell`"]
