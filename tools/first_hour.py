"""A new user's first hour, timed: a fresh clone of this repository, the
README's install block run as written (only its placeholder URL filled in
with this checkout), then every code block of the README and the docs run
with what that install gave (tests/test_docs_examples.py, under the new
environment's Python).

    python tools/first_hour.py                      # build/first_hour.json
    python tools/first_hour.py --keep /tmp/first    # keep the clone and its venv

`make first-hour` runs it. It needs the network (pip installs torch as the
README says, which may be a newer torch than `make test`'s) and about
6 GB of disk where torch's CUDA wheel is what pip picks. The quickstart's
install block must hold the same commands as the README's (it is checked);
the packages a docs page tells its reader to install for its examples
(`pip install NAME...` in its shell blocks) are installed after it.
Writes the seconds of every command and every block, and the quickstart's
total (install, then its blocks), to the JSON file; exits 1 when a command
or a block fails.
"""

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from doc_blocks import blocks  # noqa: E402

URL = "<this repository's URL>"
# The harness's own tool, installed after the README's commands: the blocks
# are run by the docs test, which needs pytest (nothing a user installs).
HARNESS = ["pytest"]


def install_block(doc: str):
    """The shell block of ``doc`` that installs pipelstm (the one that runs ``pip install ... .``)."""
    found = [b for b in blocks(doc) if b.lang == "sh" and re.search(r"pip install .*--no-build-isolation", b.code)]
    if len(found) != 1:
        raise SystemExit(f"first_hour: expected one install block in {doc}, found {len(found)}")
    return found[0]


def commands(code: str):
    """The block's command lines, comments and blank lines left out."""
    lines = []
    for line in code.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def doc_installs(skip):
    """The packages the docs tell a reader to install for a page's examples
    (``pip install NAME...`` lines of their shell blocks, outside ``skip``:
    the install blocks; never a build of pipelstm)."""
    found = []
    for doc in ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]:
        for b in blocks(doc):
            if b.lang != "sh" or b.id in skip or (b.marker and b.marker[0] == "not run"):
                continue
            for line in commands(b.code):
                words = line.split()
                if words[:2] == ["pip", "install"] and all(not w.startswith((".", "-")) for w in words[2:]):
                    found.append((b.id, line))
    return found


def run_install(lines, where: Path, log):
    """Runs the lines in one bash (so ``cd`` and ``. .venv/bin/activate`` carry over), each timed."""
    marks = where / "marks"
    script = ["set -euo pipefail", f"exec 3>{shlex.quote(str(marks))}"]
    for i, line in enumerate(lines):
        script += [f"printf '+ %s\\n' {shlex.quote(line)}", "t0=$EPOCHREALTIME", line,
                   f'echo "{i} $t0 $EPOCHREALTIME" >&3']
    script.append('echo "cwd $PWD" >&3')
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=where, stdout=log, stderr=subprocess.STDOUT)
    steps, cwd = [], None
    for mark in marks.read_text().splitlines():
        key, *rest = mark.split(" ", 1)
        if key == "cwd":
            cwd = Path(rest[0])
            continue
        t0, t1 = (float(v) for v in rest[0].split())
        steps.append(dict(command=lines[int(key)], seconds=round(t1 - t0, 1)))
    if proc.returncode != 0:
        failed = lines[len(steps)] if len(steps) < len(lines) else "(after the last command)"
        raise SystemExit(f"first_hour: the README's install failed at `{failed}` (exit {proc.returncode}); "
                         f"see {log.name}")
    return steps, cwd


def run_blocks(clone: Path, python: Path, junit: Path, log):
    """Every README and docs block, by the docs test, under the new environment's Python."""
    start = time.monotonic()
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *HARNESS], check=True, stdout=log,
                   stderr=subprocess.STDOUT)
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
                           f"--junitxml={junit}", "tests/test_docs_examples.py"],
                          cwd=clone, stdout=log, stderr=subprocess.STDOUT)
    results = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            if case.find(kind) is not None:
                outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[kind]
        results.append(dict(test=case.get("name"), seconds=round(float(case.get("time", 0)), 2), outcome=outcome))
    return proc.returncode, results, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "build" / "first_hour.json"), help="(default: %(default)s)")
    ap.add_argument("--keep", metavar="DIR", default=None,
                    help="work in DIR (must not exist) and keep it; default: a temporary folder, removed")
    args = ap.parse_args()
    readme, quick = install_block("README.md"), install_block("docs/quickstart.md")
    lines = commands(readme.code)
    if commands(quick.code) != lines:
        raise SystemExit(f"first_hour: {quick.id}'s install commands differ from {readme.id}'s:\n"
                         f"{commands(quick.code)}\n{lines}")
    if not any(URL in line for line in lines):
        raise SystemExit(f"first_hour: {readme.id} has no `git clone {URL}` to fill in")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    if args.keep and os.path.exists(args.keep):
        ap.error(f"--keep {args.keep}: the folder exists; name a new one")
    where = Path(args.keep or tempfile.mkdtemp(prefix="first_hour_")).resolve()
    where.mkdir(parents=True, exist_ok=True)
    log_path = Path(args.json).with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"first hour in {where} (log: {log_path}); the README's install block, then every docs block", flush=True)
    try:
        with open(log_path, "w") as log:
            # The clone is of the committed tree, as a user's would be.
            filled = [line.replace(URL, shlex.quote(str(ROOT))) for line in lines]
            extra = [line for _, line in doc_installs({readme.id, quick.id})]
            steps, clone = run_install(filled + extra, where, log)
            for s in steps:
                print(f"{s['seconds']:7.1f} s  {s['command']}", flush=True)
            code, results, blocks_seconds = run_blocks(clone, clone / ".venv" / "bin" / "python",
                                                       where / "blocks.xml", log)
        installed = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c",
                                    "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    finally:
        if not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    install = sum(s["seconds"] for s in steps)
    readme_install = sum(s["seconds"] for s in steps[:len(lines)])
    quickstart = [r for r in results if "docs/quickstart.md" in r["test"]]
    failed = [r["test"] for r in results if r["outcome"] == "failed"]
    summary = dict(
        commit=head.strip(), machine=dict(cpu=_cpu(), cores=os.cpu_count(), system=platform.platform()),
        torch=installed, install=steps, install_seconds=round(install, 1), blocks=results,
        blocks_seconds=round(blocks_seconds, 1),
        quickstart_seconds=round(readme_install + sum(r["seconds"] for r in quickstart), 1),
        passed=sum(r["outcome"] == "passed" for r in results), skipped=sum(r["outcome"] == "skipped" for r in results),
        failed=failed)
    Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"install {install:.0f} s (torch {installed}); blocks: {summary['passed']} passed, "
          f"{summary['skipped']} skipped, {len(failed)} failed in {blocks_seconds:.0f} s; "
          f"the quickstart (install + its blocks): {summary['quickstart_seconds']:.0f} s; {args.json}")
    for name in failed:
        print(f"FAILED {name} (see {log_path})")
    return 0 if code == 0 and not failed else 1


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor()
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)$", info, re.M)
    model = re.search(r"^model\s*:\s*(\d+)$", info, re.M)
    return " ".join(filter(None, [name and name.group(1), family and f"family {family.group(1)}",
                                  model and f"model {model.group(1)}"]))


if __name__ == "__main__":
    sys.exit(main())
