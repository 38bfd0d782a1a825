"""Runs tests many times in a row, each run a fresh pytest process, and
reports every run that failed: a test that fails once is a bug to fix at
its cause, never one to retry (docs/testing.md).

    python tools/stress.py --runs 50                       # the tests marked `processes`
    python tools/stress.py --runs 20 tests/test_distributed_timeouts.py

`make stress` runs the first (STRESS_RUNS, STRESS_TESTS override). A run
fails when pytest does, or when its output shows a process that aborted
("terminate called", "Aborted", "core dumped"): an abort after the right
message is still a failure. Writes a JSON summary (--json, default
build/stress.json) and exits 1 if any run failed.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# By default the tests that start processes which talk to each other (the
# mark `processes`, tests/process_tests.py): their outcome depends on timing,
# ports and threads, so a flake would show here.
DEFAULT_TESTS = ["-m", "processes", "tests"]
ABORT = re.compile(r"terminate called|Aborted|core dumped")


def run_once(tests, pytest_args):
    """One pytest run: (passed, failed test ids, abort lines, seconds)."""
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *pytest_args, *tests]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE)
    aborts = [line for line in proc.stdout.splitlines() if ABORT.search(line)]
    return proc.returncode == 0 and not aborts, failed, aborts, time.monotonic() - start, proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", help="test files or ids (default: the tests marked `processes`)")
    ap.add_argument("--runs", type=int, default=50, help="runs in a row (default: %(default)s)")
    ap.add_argument("--json", default=str(ROOT / "build" / "stress.json"), help="summary file (default: %(default)s)")
    ap.add_argument("--logs", default=str(ROOT / "build" / "stress"), help="where a failed run's output goes")
    ap.add_argument("--pytest-args", default="", help="more pytest options, one string")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")

    tests = args.tests or DEFAULT_TESTS
    runs = []
    for k in range(1, args.runs + 1):
        ok, failed, aborts, seconds, output = run_once(tests, args.pytest_args.split())
        run = dict(run=k, ok=ok, seconds=round(seconds, 1), failed=failed, aborts=aborts[:5])
        if not ok:
            log = Path(args.logs) / f"run{k}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(output)
            run["log"] = str(log)
        runs.append(run)
        status = "ok" if ok else f"FAILED {failed or aborts[:1]}"
        print(f"run {k}/{args.runs}: {status} ({seconds:.0f} s)", flush=True)

    bad = [r for r in runs if not r["ok"]]
    summary = dict(tests=tests, runs=args.runs, failed_runs=len(bad),
                   failed_tests=sorted({t for r in bad for t in r["failed"]}),
                   runs_with_aborts=sum(1 for r in runs if r["aborts"]), details=runs)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=1))
    print(f"{args.runs - len(bad)} of {args.runs} runs passed; {summary['runs_with_aborts']} with an abort; "
          f"summary in {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
