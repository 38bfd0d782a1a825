import pytest
import torch

from process_tests import PROCESS_TESTS


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
