"""The fenced code blocks of the user docs (README.md and docs/**/*.md), for
tests/test_docs_examples.py.

A block is run as written unless the line just before its fence says
otherwise:

* ``<!-- not run: REASON -->``: shown, never run (REASON is required: it
  installs into the reader's environment, needs a GPU, runs for hours...);
* ``<!-- run: torchrun --nproc-per-node=N -->``: a Python block that is a
  whole script for ``torchrun`` with N processes;
* ``<!-- run: on a GPU -->``: run where a CUDA device is, skipped elsewhere;
* ``<!-- run: after the block above -->``: a Python block that goes on from
  the doc's Python block before it (run as the two together).

Python blocks run as scripts; shell blocks (``sh``) are commands, each
checked as far as it can be without doing its work (``shell_commands``).
"""

import glob
import os
import re
import shlex
from dataclasses import dataclass
from typing import List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- (?P<kind>not run|run): (?P<what>.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository's root
    line: int  # of the opening fence
    lang: str
    code: str
    marker: Optional[Tuple[str, str]]  # ("not run", reason) or ("run", how)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def user_docs() -> List[str]:
    docs = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                                  glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [d for d in docs if os.path.exists(os.path.join(ROOT, d))]


def blocks(path: str, text: Optional[str] = None) -> List[Block]:
    """The fenced blocks of one doc, each with the marker on the line before it."""
    text = open(os.path.join(ROOT, path)).read() if text is None else text
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARKER.search(before)
        found.append(Block(path, line, m.group("lang"), m.group("code"),
                           (mark.group("kind"), mark.group("what")) if mark else None))
    return found


def all_blocks(lang: str) -> List[Block]:
    return [b for path in user_docs() for b in blocks(path) if b.lang == lang]


def shell_commands(code: str) -> List[List[str]]:
    """The commands of a shell block, each as its words: comments dropped,
    continuation lines joined, ``&&`` and ``;`` lists split, leading
    ``NAME=value`` assignments dropped."""
    commands = []
    code = re.sub(r"\$\([^)]*\)", "VALUE", code)  # a command substitution stands for a value
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: List[str] = []
        for w in words + [";"]:
            if w in ("&&", ";", "||"):
                while command and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", command[0]):
                    command.pop(0)
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(w)
    return commands
