"""tests/gpu: the CUDA ops on a real device.

Every test here needs a GPU; without one (torch.cuda.is_available() False,
as on the development machines and in CI) the whole folder is collected and
skipped with the reason below, never failed.
"""

import sys
from pathlib import Path

import pytest
import torch

# tests/reference.py, also when this folder is run on its own.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

_HERE = Path(__file__).resolve().parent
NO_GPU = "no CUDA device (torch.cuda.is_available() is False): tests/gpu runs only on a machine with a GPU"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_tf32():
    """Every GPU test computes float32 as float32 (TF32 off for cuBLAS and
    cuDNN), and leaves the settings as it found them."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
