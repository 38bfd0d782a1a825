"""The suite's own marks (tests/conftest.py): every test file that starts
processes which talk to each other has its tests marked `processes`, so
`make pytest` runs them one at a time and never beside the tests it runs on
several workers."""

import re
from pathlib import Path

from process_tests import PROCESS_TESTS

TESTS = Path(__file__).resolve().parent
# What starts such processes from a test: torchrun and its agents
# (distributed_utils.py), the benchmarks' process groups and the
# torch.distributed.pipelining peer built on them, and a gloo group of
# several ranks.
STARTS_PROCESSES = re.compile(r"\bTORCHRUN\b|\btwo_agents\(|\blaunch\(|\bGroup\(|\btime_pipelining\(|\bstart_peer\("
                              r"|\binit_process_group\(|\bget_context\(")


def test_every_file_that_starts_processes_is_marked():
    unmarked = [path.name for path in sorted(TESTS.glob("test_*.py"))
                if STARTS_PROCESSES.search(path.read_text())
                and not any(prefix.startswith(f"tests/{path.name}::") for prefix in PROCESS_TESTS)]
    assert not unmarked, f"start processes but have no entry in PROCESS_TESTS (tests/process_tests.py): {unmarked}"


def test_the_marked_tests_exist():
    for prefix in PROCESS_TESTS:
        path, _, name = prefix.partition("::")
        assert (TESTS.parent / path).is_file(), prefix
        assert not name or re.search(rf"^def {re.escape(name)}\b", (TESTS.parent / path).read_text(), re.M), prefix
