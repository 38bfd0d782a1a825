"""Runs a command line's Python program only as far as its argument parser:
exit 0 where argparse accepts the arguments, argparse's own exit 2 (and its
message) where it refuses them, 3 where the program ends without parsing
any. For tests/test_docs_examples.py: the docs' commands are checked as
written without doing their work (a benchmark, a training run).

    python parse_only.py -m pipelstm.bench grid --json g.json
    python parse_only.py examples/train_lm.py --pp 2
"""

import argparse
import runpy
import sys


class _Parsed(BaseException):
    pass


def main() -> int:
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    argv = sys.argv[1:]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except _Parsed:
        return 0
    print(f"parse_only: {' '.join(argv)} ended without parsing its arguments", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
