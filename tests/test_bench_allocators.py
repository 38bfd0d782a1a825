"""``bench allocators``: the training step under each allocator with the
buffer cache on and off, each configuration in its own process, against
the default (glibc, cache on)."""

import math
import os
import subprocess
import sys

import pytest

from pipelstm.bench import allocators, report


def test_allocators_quick_glibc(tmp_path):
    path = tmp_path / "allocators.json"
    subprocess.run([sys.executable, "-m", "pipelstm.bench", "allocators", "--quick", "--reps", "2",
                    "--allocators", "glibc", "--json", str(path)],
                   check=True, capture_output=True, text=True, timeout=600)
    data = report.read_json(str(path))
    rows = data["rows"]
    assert {(r["workload"], r["cache"]) for r in rows} == {
        (w, c) for w in allocators.WORKLOADS for c in ("1024 MiB", "off")}
    for r in rows:
        default = next(d for d in rows if d["workload"] == r["workload"] and d["cache"] == "1024 MiB")
        assert r["allocator"] == "glibc" and len(r["samples"]) == 2 and r["rise_mib"] >= 0
        assert math.isclose(r["speed"], default["seconds"] / r["seconds"])


@pytest.mark.skipif(not os.path.exists(allocators.ALLOCATORS["jemalloc"][0]),
                    reason="jemalloc is not installed (apt-get install libjemalloc2)")
def test_a_preloaded_allocator_is_the_one_the_process_runs(tmp_path):
    # The bench checks /proc/self/maps in each process: the row is jemalloc's only if jemalloc runs there.
    path = tmp_path / "allocators.json"
    subprocess.run([sys.executable, "-m", "pipelstm.bench", "allocators", "--quick", "--reps", "1",
                    "--allocators", "glibc", "jemalloc", "--json", str(path)],
                   check=True, capture_output=True, text=True, timeout=600)
    assert {r["allocator"] for r in report.read_json(str(path))["rows"]} == {"glibc", "jemalloc"}


def test_a_missing_allocator_stops_with_its_package(monkeypatch):
    monkeypatch.setitem(allocators.ALLOCATORS, "jemalloc", ("/nonexistent/libjemalloc.so.2", "libjemalloc2"))
    with pytest.raises(SystemExit, match="apt-get install libjemalloc2"):
        allocators.main(["--quick", "--reps", "1", "--allocators", "glibc", "jemalloc"])
