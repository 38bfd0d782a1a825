"""``python -m pipelstm.bench peak``: the FMA loop runs the FMAs it counts, in
every ISA build, and the bench writes its rows."""

import json
import subprocess
import sys

import pytest

from test_cpu_fused_kernels import ISAS, isa_under_cap, run_with

# With a = b = 1 every lane of chain c ends at c + n, exactly in float32 for
# these n: the sum tells whether the loop ran n FMAs on every chain and lane.
CHECK = """
import pipelstm._C as C
vec = round(C._fma_loop_flop(1) / 24)
for n in (0, 1, 7, 1000):
    want = sum(vec * (c + n) for c in range(12))
    got = C._fma_loop_sum(n, 1.0, 1.0)
    assert got == want, (n, got, want)
    assert C._fma_loop_flop(n) == 12 * vec * 2 * n
assert C._fma_loop_sum(3, 2.0, 0.0) == sum(vec * c * 8 for c in range(12))  # a multiplies
print(C.cpu_isa(), vec)
"""


@pytest.mark.parametrize("isa", ISAS)
def test_fma_loop_runs_the_fmas_it_counts(isa):
    if isa_under_cap(isa) != isa:
        pytest.skip(f"this CPU does not run {isa}")
    done = run_with(isa, "-c", CHECK)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [isa, {"generic": "4", "avx2": "8", "avx512": "16"}[isa]]


def test_bench_peak_writes_its_rows(tmp_path):
    path = tmp_path / "peak.json"
    done = subprocess.run([sys.executable, "-m", "pipelstm.bench", "peak", "--quick", "--repeats", "2",
                           "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(path.read_text())
    assert [r["threads"] for r in data["rows"]] == [1, 2]
    for r in data["rows"]:
        assert r["fma_gflops"] > 0 and r["mm_gflops"] > 0 and len(r["samples"]) == 2


def test_bench_peak_rejects_bad_threads():
    done = subprocess.run([sys.executable, "-m", "pipelstm.bench", "peak", "--threads", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "--threads must be at least 1" in done.stderr
