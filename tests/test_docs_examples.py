"""Every code block of the user docs (README.md, docs/**/*.md) as a reader
would use it (tests/doc_blocks.py): each Python block runs as a script in a
fresh process and a temporary folder, as written; each shell command is
checked as far as it can be without doing its work: a Python program's
arguments are parsed by the program itself (tests/scripts/parse_only.py),
a make target, script or file it names exists, a ``python -c`` runs. A
block the docs mark ``<!-- not run: REASON -->`` is skipped with REASON."""

import functools
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from doc_blocks import ROOT, Block, all_blocks, blocks, shell_commands

PARSE_ONLY = os.path.join(ROOT, "tests", "scripts", "parse_only.py")
# Programs the docs name that come from elsewhere (installers, compilers,
# version control): the test cannot check their arguments.
EXTERNAL = {"pip", "git", "nvcc", "cd", ".", "source"}
PYTHON = re.compile(r"(^|/)python3?$")


def _skip_marked(block: Block) -> None:
    if block.marker and block.marker[0] == "not run":
        pytest.skip(f"{block.id}: not run: {block.marker[1]}")


def _torchrun(block: Block) -> bool:
    return bool(block.marker) and block.marker[0] == "run" and block.marker[1].startswith("torchrun ")


# The blocks run under torchrun start processes that talk to each other: a
# test of their own, which `make stress` runs many times.
@pytest.mark.parametrize("block", [b for b in all_blocks("python") if _torchrun(b)], ids=lambda b: b.id)
def test_torchrun_block_runs_as_written(block, tmp_path):
    _run_block(block, tmp_path)


@pytest.mark.parametrize("block", [b for b in all_blocks("python") if not _torchrun(b)], ids=lambda b: b.id)
def test_python_block_runs_as_written(block, tmp_path):
    _run_block(block, tmp_path)


def _run_block(block: Block, tmp_path) -> None:
    _skip_marked(block)
    how = block.marker[1] if block.marker and block.marker[0] == "run" else ""
    code = block.code
    if how == "after the block above":
        before = [b for b in blocks(block.path) if b.lang == "python" and b.line < block.line]
        assert before, f"{block.id}: no Python block above it"
        code = before[-1].code + code
    elif how == "on a GPU":
        if not torch.cuda.is_available():
            pytest.skip(f"{block.id}: needs a GPU")
    elif how and not how.startswith("torchrun "):
        pytest.fail(f"{block.id}: unknown run marker {how!r}")
    script = tmp_path / "block.py"
    script.write_text(code)
    cmd = [sys.executable, str(script)]
    if how.startswith("torchrun "):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *how.split()[1:], str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{block.id} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def check_command(words, cwd=ROOT, parses=None):
    """None where the command holds as written, else what is wrong.
    ``parses(args, cwd)`` checks a Python program's arguments (default: _parses)."""
    parses = parses or _parses
    prog, args = words[0], words[1:]
    if prog in EXTERNAL or (PYTHON.search(prog) and args[:2] == ["-m", "venv"]):
        return None
    if prog == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        rules = "".join(open(os.path.join(ROOT, f)).read() for f in
                        ["Makefile"] + [os.path.join("mk", m) for m in sorted(os.listdir(os.path.join(ROOT, "mk")))])
        missing = [t for t in targets if not re.search(rf"^{re.escape(t)}\s*:", rules, re.MULTILINE)]
        return f"make: no target {missing}" if missing else None
    if prog == "bash":
        return None if os.path.isfile(os.path.join(cwd, args[0])) else f"bash: no file {args[0]}"
    if prog == "torchrun":
        scripts = [i for i, a in enumerate(args) if a.endswith(".py")]
        if not scripts:
            return "torchrun: no script"
        return parses([args[scripts[0]], *args[scripts[0] + 1:]], cwd)
    if PYTHON.search(prog):
        if args and args[0] == "-c":
            run = subprocess.run([sys.executable, "-c", args[1]], cwd=cwd, capture_output=True, text=True,
                                 timeout=300)
            return None if run.returncode == 0 else f"python -c failed: {run.stderr[-1500:]}"
        return parses(args, cwd)
    return f"unknown program {prog!r}: mark the block <!-- not run: REASON --> or teach this test"


def _parses(args, cwd):
    if args[0] != "-m" and not os.path.isfile(os.path.join(cwd, args[0])):
        return f"no file {args[0]}"
    code, err = _docs_commands_parsed().get((cwd, tuple(args))) or _parse_in_batch(cwd, [args])[0]
    return None if code == 0 else f"{' '.join(args)}: {err.strip()[-1500:]}"


def _parse_in_batch(cwd, commands):
    """[(exit code, stderr)] of parse_only.py for each command, all in one process."""
    run = subprocess.run([sys.executable, PARSE_ONLY, "--batch"], input=json.dumps(commands), cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"parse_only.py --batch failed: {run.stderr[-3000:]}"
    return json.loads(run.stdout)


@functools.lru_cache(maxsize=None)
def _docs_commands_parsed():
    """The parse of every Python command of the docs' shell blocks that are
    run, by (cwd, args), done once in one process."""
    found = []
    for block in all_blocks("sh"):
        if block.marker and block.marker[0] == "not run":
            continue
        for words in shell_commands(block.code):
            if words[1:2] != ["-c"]:
                check_command(words, parses=lambda args, cwd: found.append((cwd, tuple(args))))
    found = [c for c in dict.fromkeys(found) if c[1][0] == "-m" or os.path.isfile(os.path.join(c[0], c[1][0]))]
    results = {}
    for cwd in {c for c, _ in found}:
        mine = [args for c, args in found if c == cwd]
        results.update({(cwd, args): tuple(r) for args, r in zip(mine, _parse_in_batch(cwd, [list(a) for a in mine]))})
    return results


@pytest.mark.parametrize("block", all_blocks("sh"), ids=lambda b: b.id)
def test_shell_commands_are_valid_as_written(block):
    _skip_marked(block)
    problems = [f"{' '.join(w)}: {p}" for w in shell_commands(block.code) for p in [check_command(w)] if p]
    assert not problems, f"{block.id}:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path):
    assert check_command(["python", "-m", "pipelstm.bench", "grid", "--threads", "2"]) is None
    assert "unrecognized arguments: --no-such-option" in check_command(
        ["python", "-m", "pipelstm.bench", "grid", "--no-such-option"])
    assert "invalid choice" in check_command(["python", "examples/train_lm.py", "--optimizer", "nope"])
    assert check_command(["torchrun", "--nproc-per-node=2", "examples/train_lm.py", "--pp", "2"]) is None
    assert "no file" in check_command(["torchrun", "examples/no_such.py"])
    assert "no target" in check_command(["make", "no-such-target"])
    assert check_command(["make", "demo", "test"]) is None
    assert "unknown program" in check_command(["curl", "http://example.com"])
    assert "python -c failed" in check_command(["python", "-c", "raise SystemExit(1)"])
    assert shell_commands("A=1 B=2 python x.py --a 1 \\\n  --b 2  # note\ncd d && make t\n") == [
        ["python", "x.py", "--a", "1", "--b", "2"], ["cd", "d"], ["make", "t"]]
    doc = "x\n<!-- not run: needs a GPU -->\n```python\nprint(1)\n```\n\n```sh\nls\n```\n"
    first, second = blocks("doc.md", doc)
    assert first.marker == ("not run", "needs a GPU") and first.line == 3 and first.code == "print(1)\n"
    assert second.marker is None and second.lang == "sh"
