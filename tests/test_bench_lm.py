"""``bench lm``: the language-model step on nn.LSTM and pipelstm.LSTM at 1 and
2 threads and as 2 pipeline stages x 1 thread, each against nn.LSTM with 2
threads (the equal-cores baseline), for both sizes, with a summary per size.
"""

import math
import subprocess
import sys

from pipelstm.bench import lm, report


def test_lm_quick(tmp_path):
    path = tmp_path / "lm.json"
    out = subprocess.run([sys.executable, "-m", "pipelstm.bench", "lm", "--quick", "--json", str(path)],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    data = report.read_json(str(path))
    assert data["bench"] == "lm" and data["command"].endswith(f"lm --quick --json {path}")
    rows = data["rows"]
    sizes = [lm.size_label(s) for s in lm.QUICK_SIZES]
    assert list(dict.fromkeys(r["size"] for r in rows)) == sizes
    for size in sizes:
        mine = [r for r in rows if r["size"] == size]
        models = {(r["kind"], r["threads"]) for r in mine if r["kind"] != "pipeline"}
        assert models == {(k, n) for k in ("nn.LSTM", "pipelstm.LSTM") for n in (1, 2)}  # both sides
        pipes = [r for r in mine if r["kind"] == "pipeline"]
        assert sorted((r["K"], r["M"]) for r in pipes) == [(K, M) for K in (4, 8, 16) for M in (1, 2)]
        assert all(len(r["busy"]) == 2 and r["cores"] == 2 for r in pipes)
        base = next(r for r in mine if (r["kind"], r["threads"]) == ("nn.LSTM", 2))["seconds"]
        for r in mine:
            assert r["seconds"] > 0 and len(r["samples"]) == 5 and min(r["samples"]) > 0
            assert math.isclose(r["ratio"], base / r["seconds"])
    (summary,) = data["tables"]
    assert summary["title"] == "Summary" and [s["size"] for s in summary["rows"]] == sizes
    for s in summary["rows"]:
        assert s["best_ratio"] == max(s["ours_ratio"], s["pipe_ratio"]) and s["best_K"] in (4, 8, 16)
        one = next(r for r in rows if r["size"] == s["size"] and (r["kind"], r["threads"]) == ("pipelstm.LSTM", 1))
        assert math.isclose(s["pipe_vs_one"], one["seconds"] / s["pipe"])  # what the second core buys
    assert any("stands in for one device per stage" in n for n in data["notes"])
    for size in sizes:
        assert f"{size}: pipelstm.LSTM 2 threads: " in out
    assert "best of {pipelstm.LSTM 2 threads, 2 stages x 1 thread}: " in out
