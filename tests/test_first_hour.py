"""tools/first_hour.py (`make first-hour`) reads the install commands out
of the README and the quickstart: both blocks must exist, hold the same
commands and the clone URL it fills in, and a failing command must be
named with its exit code (run here on a tiny block, no network)."""

import importlib.util
import os
import sys
import subprocess

import pytest

from doc_blocks import ROOT

_spec = importlib.util.spec_from_file_location("first_hour", os.path.join(ROOT, "tools", "first_hour.py"))
first_hour = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(first_hour)


def test_readme_and_quickstart_install_the_same_way():
    readme = first_hour.commands(first_hour.install_block("README.md").code)
    quick = first_hour.commands(first_hour.install_block("docs/quickstart.md").code)
    assert readme == quick
    assert readme[0].startswith(f"git clone {first_hour.URL}")
    assert any("pip install" in c and "--no-build-isolation" in c for c in readme)
    assert all("#" not in c for c in readme)  # comments left out


def test_the_docs_installs_are_packages_never_a_build():
    skip = {first_hour.install_block("README.md").id, first_hour.install_block("docs/quickstart.md").id}
    found = dict((line, where) for where, line in first_hour.doc_installs(skip))
    assert "pip install onnx onnxscript onnxruntime" in found  # the ONNX exporter's, docs/export.md
    assert not any(" ." in line or " -e" in line for line in found)


def test_each_command_is_timed_in_one_shell(tmp_path):
    with open(tmp_path / "log", "w") as log:
        lines = ["mkdir sub && cd sub", "X=1", 'test "$X" = 1 && pwd', 'python3 -c "import os; print(os.sep)"']
        steps, cwd = first_hour.run_install(lines, tmp_path, log)
    assert [s["command"] for s in steps] == lines
    assert all(s["seconds"] >= 0 for s in steps) and cwd == tmp_path / "sub"
    assert "+ " + lines[-1] in (tmp_path / "log").read_text()  # each command shown as written


def test_a_failing_command_is_named(tmp_path):
    with open(tmp_path / "log", "w") as log, pytest.raises(SystemExit, match=r"failed at `false` \(exit 1\)"):
        first_hour.run_install(["true", "false", "true"], tmp_path, log)


def test_help_runs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "first_hour.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "first hour" in out and "--keep" in out
