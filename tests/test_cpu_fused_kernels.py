"""The fused CPU step kernels (kernels/src/cpu/cpu_recurrent_*.cpp) in every
build this CPU runs, against nn.LSTM in float64, and their ISA switch.

The kernels are chosen once per process, so each ISA runs in a child process
with PIPELSTM_CPU_ISA set (tests/scripts/fused_kernels_check.py). The rest of
the suite runs the default (widest) build in this process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipelstm

SCRIPT = Path(__file__).parent / "scripts" / "fused_kernels_check.py"
ISAS = ["generic", "avx2", "avx512"]


def run_with(isa: str, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIPELSTM_CPU_ISA=isa, **env_vars)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)


def isa_under_cap(isa: str) -> str:
    done = run_with(isa, "-c", "import pipelstm; print(pipelstm._C.cpu_isa())")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# The forward's input projection as one GEMM over all steps ("0") and
# inside each step ("1"), whichever the sizes would pick.
@pytest.mark.parametrize("in_steps", ["0", "1"])
@pytest.mark.parametrize("isa", ISAS)
def test_each_isa_matches_float64_nn_lstm(isa, in_steps):
    if isa_under_cap(isa) != isa:
        pytest.skip(f"this CPU does not run the {isa} build")
    done = run_with(isa, str(SCRIPT), PIPELSTM_INPUT_IN_STEPS=in_steps)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["isa"] == isa
    bad = [r for r in report["results"] if not r["rel_error"] < 2e-5]
    assert not bad, f"{isa}: cases off the float64 reference: {bad}"
    # NaN and inf where nn.LSTM has them, and no more; saturated gates have
    # exactly zero derivative (a polynomial exp that never reaches 0 or inf
    # once gave an input gradient of 1e17 here, nn.LSTM's being 0.5).
    assert report["non_finite_mismatches"] == [], f"{isa}: NaN/inf pattern differs from nn.LSTM's"
    # A NaN or inf weight with no hx: 0 * inf is NaN in the first step too.
    assert report["weight_non_finite_mismatches"] == [], f"{isa}: a non-finite weight's NaN/inf pattern differs"
    assert report["saturated_rel_error"] < 1e-5
    # The cell's sigmoid and tanh within a few float32 ulp of float64 (about
    # 4e-7 seen; 1e-6 is some 17 ulp).
    assert report["activation_rel_error"] < 1e-6, report["activation_rel_error"]
    assert report["gemm_rel_error"] < 1e-5, report["gemm_rel_error"]


def test_the_cap_never_widens():
    assert isa_under_cap("generic") == "generic"
    default = isa_under_cap("")
    assert default in ISAS
    # A cap wider than the CPU runs falls back to the widest it runs.
    assert isa_under_cap("avx512") == default


def test_an_unknown_isa_is_a_clear_error():
    done = run_with("sse9", "-c", "import torch, pipelstm; pipelstm.LSTM(4, 4)(torch.randn(2, 1, 4))")
    assert done.returncode != 0
    assert "PIPELSTM_CPU_ISA=sse9 is not one of avx512, avx2, generic" in done.stderr


def test_default_isa_is_reported():
    assert pipelstm._C.cpu_isa() in ISAS
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert pipelstm._C.cpu_isa() != "generic"
