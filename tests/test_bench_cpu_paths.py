"""python -m pipelstm.bench cpu_paths: every candidate path is timed, the
chosen one is among them, and the bench writes its JSON."""

import json

from pipelstm import _C
from pipelstm.backends import cpu
from pipelstm.bench import cpu_paths


def test_quick_run_times_every_candidate_and_writes_its_json(tmp_path):
    path = tmp_path / "r.json"
    rows = cpu_paths.main(["--quick", "--threads", "1", "--repeats", "5", "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["bench"] == "cpu_paths" and len(rows) == 1
    row = rows[0]
    assert row["fastest"] in row["candidates"] and set(row["chosen"].split(", ")) <= set(row["candidates"])
    assert row["chosen_over_fastest"] == row["step_chosen"] / row["candidates"][row["fastest"]]
    assert row["fastest"] == min(row["candidates"], key=row["candidates"].get)
    assert row["run_from_scratch"] > 0 and row["run_on_chosen"] > 0
    assert data["rows"][0]["candidates"] == row["candidates"]
    # The bench leaves no choice and no switch behind.
    assert cpu.chosen_paths() == [] and cpu.benchmark is False and cpu.benchmark_cache == ""
    assert _C._get_switch("PIPELSTM_CPU_BENCHMARK")[1] == "default"
