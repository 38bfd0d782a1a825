"""pipelstm.backends: the run-time switches from Python (csrc/settings.h).

Each switch is a value set from Python, else its environment variable,
else its default; a set value overrides the variable until it is deleted,
and bad values are refused naming the switch and the values it takes.
The effect is checked where the C++ side reports it (the GEMM backend, the
buffer cache keeping a freed buffer, the ISA of the kernels), and every
switch's variable is read through the one lookup.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipelstm
from pipelstm import _C
from pipelstm.backends import cpu, cuda

ROOT = Path(__file__).resolve().parents[1]
SWITCHES = _C._switch_names()

# (module, attribute, environment variable, default, a value set from
# Python, the same value as the variable spells it, a value refused)
PUBLIC = [
    (cpu, "isa", "PIPELSTM_CPU_ISA", "native", "generic", "generic", "sse9"),
    (cpu, "gemm", "PIPELSTM_CPU_GEMM", "auto", "aten", "aten", "mkl"),
    (cpu, "buffer_cache_mb", "PIPELSTM_BUFFER_CACHE_MB", 1024, 0, "0", -1),
    (cuda, "graphs", "PIPELSTM_CUDA_GRAPHS", None, True, "1", None),
    (cuda, "persistent", "PIPELSTM_PERSISTENT", None, True, "1", None),
    (cuda, "persistent_kernel", "PIPELSTM_PERSISTENT_KERNEL", "grid", "cluster", "cluster", "tma"),
    (cuda, "layer_wavefront", "PIPELSTM_LAYER_WAVEFRONT", 0, 8, "8", 1),
    (cuda, "stack_graph", "PIPELSTM_STACK_GRAPH", 0, 1, "1", 4097),
]


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    """Every switch starts (and ends) with no value from Python and no variable."""
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
        if name != "PIPELSTM_CPU_ISA":  # read once; the tests below never change it in this process
            _C._set_switch(name, None)
    yield
    for name in SWITCHES:
        if name != "PIPELSTM_CPU_ISA":
            _C._set_switch(name, None)


def test_every_switch_has_a_lookup_and_no_variable_is_read_elsewhere():
    assert SWITCHES == ["PIPELSTM_CPU_ISA", "PIPELSTM_CPU_GEMM", "PIPELSTM_CPU_BENCHMARK", "PIPELSTM_CPU_BENCHMARK_CACHE",
                        "PIPELSTM_BUFFER_CACHE_MB", "PIPELSTM_CUDA_GRAPHS",
                        "PIPELSTM_PERSISTENT", "PIPELSTM_PERSISTENT_KERNEL", "PIPELSTM_LAYER_WAVEFRONT",
                        "PIPELSTM_STACK_GRAPH",
                        "PIPELSTM_SPLIT_DEPTH", "PIPELSTM_ROW_SPLIT",
                        "PIPELSTM_INPUT_IN_STEPS", "PIPELSTM_HOST_COPY_STREAM"]
    # The C++ side reads a variable only through settings.cpp's lookup.
    readers = []
    for path in [*ROOT.glob("csrc/**/*.cpp"), *ROOT.glob("csrc/**/*.h"), *ROOT.glob("kernels/**/*.cpp"),
                 *ROOT.glob("kernels/**/*.h"), *ROOT.glob("kernels/**/*.cu")]:
        if path.name != "settings.cpp" and re.search(r"getenv\(", path.read_text()):
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []


# The ISA is read once per process: test_the_isa_is_set_before_the_first_call... runs it in a process of its own.
@pytest.mark.parametrize("module, attr, env, default, value, spelled, bad", PUBLIC[1:], ids=[p[2] for p in PUBLIC[1:]])
def test_python_overrides_the_variable_until_deleted(monkeypatch, module, attr, env, default, value, spelled, bad):
    assert getattr(module, attr) == default
    assert _C._get_switch(env)[1] == "default"
    monkeypatch.setenv(env, spelled)  # read at each look-up
    assert getattr(module, attr) == value
    assert _C._get_switch(env)[1] == "env"
    setattr(module, attr, default)  # Python wins over the variable
    assert getattr(module, attr) == default
    assert _C._get_switch(env)[1] == "python"
    delattr(module, attr)  # the variable again
    assert getattr(module, attr) == value
    assert _C._get_switch(env)[1] == "env"


@pytest.mark.parametrize("module, attr, env, default, value, spelled, bad",
                         [p for p in PUBLIC if p[-1] is not None], ids=[p[2] for p in PUBLIC if p[-1] is not None])
def test_a_value_the_switch_does_not_take_is_refused_naming_it(module, attr, env, default, value, spelled, bad):
    before = _C._get_switch(env)
    with pytest.raises(ValueError, match=rf"{module.__name__}\.{attr}: pipelstm: cannot set {env} to "
                                         rf"'{bad}': it takes (one of|a whole number)"):
        setattr(module, attr, bad)
    assert _C._get_switch(env) == before  # nothing changed


def test_a_value_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match=r"pipelstm.backends.cpu.gemm \(PIPELSTM_CPU_GEMM\) must be a str"):
        cpu.gemm = 1
    with pytest.raises(TypeError, match=r"buffer_cache_mb \(PIPELSTM_BUFFER_CACHE_MB\) must be an int"):
        cpu.buffer_cache_mb = 1.5
    with pytest.raises(TypeError, match=r"buffer_cache_mb .* must be an int"):
        cpu.buffer_cache_mb = True
    with pytest.raises(TypeError, match=r"pipelstm.backends.cuda.graphs \(PIPELSTM_CUDA_GRAPHS\) must be True, False"):
        cuda.graphs = "yes"
    with pytest.raises(TypeError, match=r"persistent \(PIPELSTM_PERSISTENT\) must be True, False or None"):
        cuda.persistent = 1


def test_a_bad_variable_is_an_error_where_it_is_read(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "maybe")
    with pytest.raises(RuntimeError, match=r"PIPELSTM_CUDA_GRAPHS=maybe is not one of 0 \(never\), 1"):
        cuda.graphs
    for bad in ("lots", "-5"):
        monkeypatch.setenv("PIPELSTM_BUFFER_CACHE_MB", bad)
        with pytest.raises(RuntimeError, match=f"PIPELSTM_BUFFER_CACHE_MB={bad} is not a whole number of MiB"):
            _C._empty_buffer(1 << 20)  # checked where a buffer is taken (a free cannot raise)
    cpu.buffer_cache_mb = 16  # a value from Python is used instead of the variable
    assert _C._empty_buffer(1 << 20).numel() == 1 << 20


def test_the_gemm_switch_picks_what_runs_the_gemms():
    cpu.gemm = "own"
    assert cpu.current_gemm() == "own"
    cpu.gemm = "aten"
    assert cpu.current_gemm() == "aten"
    # The product is the same either way (the kernels' GEMM against at::mm).
    a, b = torch.randn(64, 48), torch.randn(48, 40)
    outs = []
    for gemm in ("own", "aten"):
        cpu.gemm = gemm
        out = torch.empty(64, 40)
        _C._layer_mm_out(out, a, b)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1], (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-5)


def test_the_knobs_for_measurements_are_environment_only_and_still_read_per_call(monkeypatch):
    assert pipelstm.backends.attributes() == {
        "PIPELSTM_CPU_ISA": "pipelstm.backends.cpu.isa", "PIPELSTM_CPU_GEMM": "pipelstm.backends.cpu.gemm",
        "PIPELSTM_CPU_BENCHMARK": "pipelstm.backends.cpu.benchmark",
        "PIPELSTM_CPU_BENCHMARK_CACHE": "pipelstm.backends.cpu.benchmark_cache",
        "PIPELSTM_BUFFER_CACHE_MB": "pipelstm.backends.cpu.buffer_cache_mb",
        "PIPELSTM_CUDA_GRAPHS": "pipelstm.backends.cuda.graphs",
        "PIPELSTM_PERSISTENT": "pipelstm.backends.cuda.persistent",
        "PIPELSTM_PERSISTENT_KERNEL": "pipelstm.backends.cuda.persistent_kernel",
        "PIPELSTM_LAYER_WAVEFRONT": "pipelstm.backends.cuda.layer_wavefront",
        "PIPELSTM_STACK_GRAPH": "pipelstm.backends.cuda.stack_graph"}
    for name, default in [("PIPELSTM_SPLIT_DEPTH", "auto"), ("PIPELSTM_ROW_SPLIT", "auto"),
                          ("PIPELSTM_INPUT_IN_STEPS", "auto"), ("PIPELSTM_HOST_COPY_STREAM", "off")]:
        assert _C._get_switch(name) == (default, "default")
        monkeypatch.setenv(name, "0")
        assert _C._get_switch(name) == ("0", "env")
    monkeypatch.setenv("PIPELSTM_ROW_SPLIT", "2")
    with pytest.raises(RuntimeError, match=r"PIPELSTM_ROW_SPLIT=2 is not one of 0 \(never\), 1 \(always\), auto"):
        _C._get_switch("PIPELSTM_ROW_SPLIT")


def test_flags_sets_switches_for_a_block_and_restores_them(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", "own")
    cpu.buffer_cache_mb = 7
    with cpu.flags(gemm="aten", buffer_cache_mb=0):
        assert (cpu.gemm, cpu.buffer_cache_mb) == ("aten", 0)
    assert _C._get_switch("PIPELSTM_CPU_GEMM") == ("own", "env")  # no override before: none after
    assert _C._get_switch("PIPELSTM_BUFFER_CACHE_MB") == ("7", "python")
    with pytest.raises(AttributeError, match="no switch named threads"):
        cpu.flags(threads=2)
    with pytest.raises(ZeroDivisionError):
        with cuda.flags(graphs=False):
            1 / 0
    assert cuda.graphs is None


def test_unknown_switch_names_are_refused():
    with pytest.raises(ValueError, match="no switch named 'PIPELSTM_FAST'; the switches are PIPELSTM_CPU_ISA"):
        _C._get_switch("PIPELSTM_FAST")


_ISA_SCRIPT = """
import torch, pipelstm
from pipelstm.backends import cpu
assert not pipelstm._C._cpu_isa_chosen()
cpu.isa = "GENERIC"  # before the first call: it takes effect (any case)
assert cpu.isa == "generic" and cpu.current_isa() == "generic"
pipelstm.LSTM(4, 4)(torch.randn(3, 2, 4))  # the first call chooses the kernels
assert pipelstm._C._cpu_isa_chosen() and cpu.current_isa() == "generic"
cpu.isa = "generic"  # the same value: nothing changes
try:
    cpu.isa = "native"
except RuntimeError as e:
    print(e)
assert cpu.current_isa() == "generic" and cpu.isa == "generic"
"""


def test_the_isa_is_set_before_the_first_call_and_refused_after_it():
    done = subprocess.run([sys.executable, "-c", _ISA_SCRIPT], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PIPELSTM_CPU_ISA"})
    assert done.returncode == 0, done.stderr
    assert ("pipelstm.backends.cpu.isa: pipelstm: PIPELSTM_CPU_ISA is read once, by the first call that runs "
            "the CPU kernels, and was 'generic'; it cannot change in this process") in done.stdout


def test_every_switch_is_documented_in_one_place():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for name in SWITCHES:
        assert f"| `{name}` |" in doc, name
    for env, attribute in pipelstm.backends.attributes().items():
        assert f"| `{env}` | `{attribute}` |" in doc, env
