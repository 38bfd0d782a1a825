"""``python -m pipelstm.bench``: -h / --help list every command with a line
each and exit 0; a missing or unknown command exits non-zero with the list;
``--device cuda`` with no CUDA device is a usage error."""

import importlib
import pkgutil
import subprocess
import sys

import pytest
import torch

import pipelstm.bench
from pipelstm.bench.__main__ import COMMANDS



def _modules_with_main() -> set:
    """The modules of pipelstm.bench with a main(argv): each must be a command
    (pipelining_peer's is "pipelining")."""
    names = {m.name for m in pkgutil.iter_modules(pipelstm.bench.__path__) if not m.name.startswith("_")}
    found = {n for n in names if hasattr(importlib.import_module(f"pipelstm.bench.{n}"), "main")}
    return {"pipelining" if n == "pipelining_peer" else n for n in found}


EXPECTED = _modules_with_main()


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelstm.bench", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_lists_every_command_and_exits_0(flag):
    done = _bench(flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m pipelstm.bench <command> [options]")
    assert set(COMMANDS) == EXPECTED
    listed = {}
    for line in done.stdout.splitlines():
        words = line.split(maxsplit=1)
        if line.startswith("  ") and words and words[0] in COMMANDS:
            listed[words[0]] = words[1] if len(words) > 1 else ""
    assert set(listed) == EXPECTED
    assert all(len(text) > 10 for text in listed.values()), listed


@pytest.mark.parametrize("args, what", [(["bogus"], "unknown command 'bogus'"), ([], "no command given")])
def test_a_missing_or_unknown_command_exits_non_zero_with_the_list(args, what):
    done = _bench(*args)
    assert done.returncode == 2
    assert "usage: python -m pipelstm.bench <command>" in done.stderr
    assert "  layer " in done.stderr
    assert done.stderr.rstrip().endswith(f"error: {what}")


def test_a_command_gets_its_own_help():
    done = _bench("peak", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "peak" in done.stdout


def test_every_bench_module_with_a_main_is_a_command():
    import importlib
    import pkgutil

    import pipelstm.bench

    mains = {importlib.import_module(f"pipelstm.bench.{m.name}").main
             for m in pkgutil.iter_modules(pipelstm.bench.__path__) if m.name != "__main__"
             if hasattr(importlib.import_module(f"pipelstm.bench.{m.name}"), "main")}
    assert mains == {entry for entry, _ in COMMANDS.values()}


@pytest.mark.parametrize("command", ["layernorm", "regularisation"])
def test_device_cuda_without_a_device_is_a_usage_error_before_any_work(command, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as here, also on a GPU machine
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"pipelstm.bench.{command}").main(["--quick", "--device", "cuda"])
    assert stop.value.code == 2
    assert "--device cuda: torch sees no CUDA device" in capsys.readouterr().err
