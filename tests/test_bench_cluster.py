"""python -m pipelstm.bench cluster --quick: the predicted scaling tables and
their assumptions, written to JSON (no GPU: the simulator on a cost model)."""

import json
from pathlib import Path

import pytest

from pipelstm.bench import cluster


def test_quick_run_writes_the_tables_and_their_assumptions(tmp_path):
    path = tmp_path / "cluster.json"
    measured = [str(Path(__file__).resolve().parents[1] / p) for p in cluster.GPU_JSON]
    rows = cluster.main(["--quick", "--gpu-json", *measured, "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["bench"] == "cluster" and "predicted, not measured" in data["device"]
    assert [r["gpus"] for r in rows if r["B"] == 256] == [1, 2, 4, 8]
    one = next(r for r in rows if r["B"] == 256 and r["gpus"] == 1)
    assert one["speedup"] == pytest.approx(1.0) and one["layout"].startswith("dp 1x1")
    for r in rows:
        assert r["tokens"] == pytest.approx(64 * r["B"] / r["step"])
        first = next(o for o in rows if o["B"] == r["B"] and o["gpus"] == 1)
        assert r["speedup"] == pytest.approx(first["step"] / r["step"])
        if r["gpus"] % 2 == 0:  # the main job has 2 LSTM layers: the seed's scheme needs an even world
            assert r["seed_step"] >= r["step"] * (1 - 1e-9)  # the search includes the seed's layout's depth
    depth = data["tables"][0]["rows"]
    assert {r["cluster"] for r in depth} == {"1 node, NVLink", "1 node, PCIe"}
    assert min(r["vs_best"] for r in depth if r["cluster"] == "1 node, PCIe") == pytest.approx(1.0)
    fit = data["cost_model"]["lstm_fit"]
    assert fit["measured_on"] == "NVIDIA H200" and fit["max_rel_error"] < 0.10
    assert data["clusters"]["h100x8"]["intra_node"]["GB_per_s"] == pytest.approx(360.0)
    text = " ".join(data["notes"])
    for assumption in ("not measured", "extrapolation by FLOPs", "spec sheet", "360 GB/s", "optimizer's state",
                       "seed's scheme"):
        assert assumption in text, assumption


def test_missing_gpu_results_are_named(tmp_path):
    with pytest.raises(SystemExit):
        cluster.main(["--quick", "--gpu-json", str(tmp_path / "none.json")])
