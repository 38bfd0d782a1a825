import pytest
import torch

# The tests that start processes which talk to each other (torch.distributed
# over gloo, torchrun, the pipeline's remote stages, the bench's process
# groups): their outcome depends on timing, ports and threads, so they carry
# the mark `processes` and run alone. `make pytest` runs the rest on
# TEST_JOBS workers first, then these one at a time; `make stress` repeats
# these (tools/stress.py).
PROCESS_TESTS = (
    "tests/test_distributed.py::",
    "tests/test_distributed_auto_layout.py::",
    "tests/test_distributed_mesh.py::",
    "tests/test_distributed_packed.py::",
    "tests/test_distributed_timeouts.py::",
    "tests/test_docs_examples.py::test_torchrun_block_runs_as_written",
    "tests/test_module_ddp.py::",
    "tests/test_pipeline_remote.py::",
    "tests/test_pipelining_peer.py::",
    "tests/test_bench_pipeline.py::",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(PROCESS_TESTS):
            item.add_marker(pytest.mark.processes)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def mesh(tmp_path):
    """A gloo process group of this process alone and its mesh of one
    pipeline stage (tests/distributed_utils.py's ``one_process_mesh``)."""
    from distributed_utils import one_process_mesh

    with one_process_mesh(tmp_path, pp=1, timeout=60) as m:
        yield m
