"""pipelstm.config_info / show_config, the check that the compiled part was
built for the running torch, and the package's logging.

The build check runs in fresh processes on a copy of the package whose
generated _build_info.py names another torch: the import must stop before
the compiled module is loaded, naming both versions and the fix.
"""

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm import _C, _build_info

PACKAGE = Path(pipelstm.__file__).resolve().parent


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    for name in _C._switch_names():
        monkeypatch.delenv(name, raising=False)
        if name != "PIPELSTM_CPU_ISA":
            _C._set_switch(name, None)
    yield
    for name in _C._switch_names():
        if name != "PIPELSTM_CPU_ISA":
            _C._set_switch(name, None)


def test_config_info_describes_this_build_and_its_switches(monkeypatch):
    monkeypatch.setenv("PIPELSTM_ROW_SPLIT", "1")
    pipelstm.backends.cpu.gemm = "aten"
    info = pipelstm.config_info()
    assert info["version"] == pipelstm.__version__
    assert info["torch_running"] == torch.__version__
    assert info["torch_built"] == _build_info.torch_version
    # The generated file agrees with the headers the module was compiled against.
    assert info["torch_built"].split("+")[0] == _C._built_torch_version()
    assert info["cuda_built"] is _C.built_with_cuda() is _build_info.cuda
    assert info["cuda_archs"] == (_build_info.cuda_archs if info["cuda_built"] else [])
    assert info["cpu_isa"] == _C.cpu_isa() in ("avx512", "avx2", "generic")
    assert info["cpu_gemm"] == "aten"
    assert list(info["switches"]) == _C._switch_names()
    assert info["switches"]["PIPELSTM_CPU_GEMM"] == dict(value="aten", source="python",
                                                         attribute="pipelstm.backends.cpu.gemm")
    assert info["switches"]["PIPELSTM_ROW_SPLIT"] == dict(value="1", source="env", attribute=None)
    assert info["switches"]["PIPELSTM_BUFFER_CACHE_MB"] == dict(value="1024", source="default",
                                                                attribute="pipelstm.backends.cpu.buffer_cache_mb")


def test_show_config_prints_every_switch_with_its_source(monkeypatch, capsys):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "bogus")  # shown as an error, not raised
    pipelstm.backends.cuda.persistent = True
    pipelstm.show_config()
    out = capsys.readouterr().out
    assert f"torch built against: {_build_info.torch_version}" in out
    assert f"torch running:       {torch.__version__}" in out
    assert f"CPU kernels' ISA:    {_C.cpu_isa()}" in out
    assert f"CPU GEMMs:           {_C.cpu_gemm()}" in out
    for name in _C._switch_names():
        assert name in out
    assert re.search(r"PIPELSTM_PERSISTENT +  = 1 \(python; pipelstm.backends.cuda.persistent\)", out)
    assert re.search(r"PIPELSTM_SPLIT_DEPTH +  = auto \(default; environment only\)", out)
    assert re.search(r"PIPELSTM_CUDA_GRAPHS +  = error: pipelstm: PIPELSTM_CUDA_GRAPHS=bogus is not one of", out)
    me = pipelstm.backends.cpu.current_cpu()
    assert f"CPU:                 {me['vendor']} family {me['family']} model {me['model']} ({me['microarchitecture']}" in out


def _package_copy(tmp_path: Path, torch_version: str) -> Path:
    """A copy of the installed package (compiled module included) whose
    build info names `torch_version`."""
    copy = tmp_path / "site" / "pipelstm"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    info = (copy / "_build_info.py").read_text()
    (copy / "_build_info.py").write_text(info.replace(repr(_build_info.torch_version).replace("'", '"'),
                                                      f'"{torch_version}"'))
    return copy.parent


_IMPORT = """
import sys
try:
    import pipelstm
except ImportError as e:
    print("ImportError:", e)
    print("module loaded:", "pipelstm._C" in sys.modules)
    sys.exit(3)
print("imported from", pipelstm.__file__)
"""


def _import_from(site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, env=env, timeout=300,
                          cwd=site)


def test_a_build_for_another_torch_stops_at_import_naming_both(tmp_path):
    site = _package_copy(tmp_path, "2.3.1+cpu")
    assert '"2.3.1+cpu"' in (site / "pipelstm" / "_build_info.py").read_text()
    done = _import_from(site)
    assert done.returncode == 3, done.stdout + done.stderr
    assert (f"pipelstm was built against torch 2.3.1+cpu, but torch {torch.__version__} is running; "
            "rebuild with `pip install --no-build-isolation .`") in done.stdout
    assert "module loaded: False" in done.stdout  # checked before the loader


def test_a_build_whose_torch_differs_only_in_its_local_label_imports(tmp_path):
    # +cpu / +cu128 name the wheel's variant, not the C++ ABI.
    release = torch.__version__.split("+")[0]
    done = _import_from(_package_copy(tmp_path, f"{release}+cu999"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"imported from {tmp_path / 'site' / 'pipelstm'}" in done.stdout


def test_the_package_logger_is_quiet_by_default():
    logger = logging.getLogger("pipelstm")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)


def test_the_cpu_choices_are_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="pipelstm"):
        pipelstm.log_choices()
    assert f"CPU kernels: {_C.cpu_isa()} (PIPELSTM_CPU_ISA: " in caplog.text
    assert f"whole-batch CPU GEMMs: {_C.cpu_gemm()} (PIPELSTM_CPU_GEMM: auto, from default)" in caplog.text


def test_a_switch_set_from_python_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="pipelstm"):
        pipelstm.backends.cpu.gemm = "own"
    assert "pipelstm.backends.cpu.gemm = 'own' (PIPELSTM_CPU_GEMM; was auto, from default)" in caplog.text


def test_the_cpp_side_logs_through_the_package_logger(caplog):
    # The sink CUDA graph captures use (csrc/log_sink.h), called without the GIL.
    with caplog.at_level(logging.INFO, logger="pipelstm"):
        _C._log(logging.WARNING, "CUDA graph: a test message")
        _C._log(logging.DEBUG, "below the level")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("pipelstm", logging.WARNING, "CUDA graph: a test message")]


def test_the_pipeline_plan_is_logged(caplog):
    model = nn.Sequential(nn.Embedding(20, 8), pipelstm.LSTM(8, 8, num_layers=3), nn.Linear(8, 20))
    with caplog.at_level(logging.INFO, logger="pipelstm"):
        pipe = pipelstm.Pipeline(model, devices=["cpu", "cpu"], chunks=2, threads=1)
    plan = [r.getMessage() for r in caplog.records if r.name == "pipelstm.pipeline.balance"]
    assert len(plan) == 1
    units = [u.name for u in pipe.core.units]
    first = ", ".join(units[:pipe.core.balance[0]])
    assert plan[0].startswith(f"Pipeline: {len(units)} units in 2 stages, by the units' costs; stage 0: {first} (")
    placement = [r.getMessage() for r in caplog.records if r.name == "pipelstm.pipeline.placement"]
    assert "placement: stage 0 on cpu; stage 1 on cpu" in placement
    assert "Pipeline: intra-op threads per stage [1, 1]" in placement


def test_the_version_is_the_packages():
    # pyproject.toml's version is the one the built package carries.
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "pyproject.toml")).read()
    assert re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1) == pipelstm.__version__
