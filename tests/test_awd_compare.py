"""tools/awd_compare.py: the example trained both ways for each seed, one
run at a time or side by side, into a bench JSON whose perplexities are the
runs' own (each run is deterministic, so side by side changes only times)."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--seeds", "1", "--epochs", "1", "--max-batches", "2", "--eval-batches", "2", "--nhid", "8",
         "--threads", "1"]


def _tool():
    spec = importlib.util.spec_from_file_location("awd_compare", os.path.join(ROOT, "tools", "awd_compare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, name, *extra):
    out = tmp_path / name
    assert _tool().main([*SMALL, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_runs_side_by_side_give_the_perplexities_of_runs_in_turn(tmp_path):
    in_turn = _run(tmp_path, "turn.json")
    side_by_side = _run(tmp_path, "side.json", "--jobs", "2")
    for report in (in_turn, side_by_side):
        assert [(r["seed"], r["lstm"]) for r in report["rows"]] == [(1, "pipelstm"), (1, "nn")]
    assert [r["valid_ppl"] for r in side_by_side["rows"]] == [r["valid_ppl"] for r in in_turn["rows"]]
    summary = side_by_side["tables"][0]["rows"]
    assert [s["ppl"] for s in summary] == [r["valid_ppl"] for r in side_by_side["rows"]]
    assert "2 runs at once" in side_by_side["notes"][0]


def test_jobs_below_one_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _tool().main([*SMALL, "--jobs", "0"])
    assert "--jobs must be at least 1" in capsys.readouterr().err
