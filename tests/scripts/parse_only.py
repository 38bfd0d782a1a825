"""Runs a command line's Python program only as far as its argument parser:
exit 0 where argparse accepts the arguments, argparse's own exit 2 (and its
message) where it refuses them, 3 where the program ends without parsing
any. For tests/test_docs_examples.py: the docs' commands are checked as
written without doing their work (a benchmark, a training run).

    python parse_only.py -m pipelstm.bench grid --json g.json
    python parse_only.py examples/train_lm.py --pp 2
    python parse_only.py --batch < commands.json     # [[arg, ...], ...] -> [[exit code, stderr], ...]

With --batch every command runs in this one process, one after the other
(each alone would import torch again), and the results are printed as JSON.
"""

import argparse
import contextlib
import io
import json
import runpy
import sys


class _Parsed(BaseException):
    pass


def parse(argv) -> int:
    """The exit code of argv's program stopped after its argument parser."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    saved = sys.argv
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except _Parsed:
        return 0
    finally:
        argparse.ArgumentParser.parse_args = real
        sys.argv = saved
    print(f"parse_only: {' '.join(argv)} ended without parsing its arguments", file=sys.stderr)
    return 3


def batch(commands):
    results = []
    for argv in commands:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = parse(argv)
            except SystemExit as e:  # argparse's refusal (2), or --help (0)
                code = e.code if isinstance(e.code, int) else 1
        results.append([code, err.getvalue()])
    return results


def main() -> int:
    if sys.argv[1:] == ["--batch"]:
        json.dump(batch(json.load(sys.stdin)), sys.stdout)
        return 0
    return parse(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
