"""Where a CUDA layer call tries the persistent recurrent kernels
(csrc/persistent_rule.h). Unset, ``PIPELSTM_PERSISTENT`` leaves it to the
rule measured on an H100: float16/bfloat16, T >= 500, B <= 8, H <= 512;
1 runs them wherever they fit (B <= 64), 0 never. The rule is checked here,
on any machine; the kernels' numerics on a GPU in tests/gpu.
"""

import pytest
import torch

import pipelstm
from pipelstm.backends import cuda

use = pipelstm._C._use_persistent


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    monkeypatch.delenv("PIPELSTM_PERSISTENT", raising=False)
    pipelstm._C._set_switch("PIPELSTM_PERSISTENT", None)
    yield
    pipelstm._C._set_switch("PIPELSTM_PERSISTENT", None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unset_the_rule_takes_long_sequences_of_small_batches_on_tensor_cores(dtype):
    assert cuda.persistent is None
    assert use(dtype, 500, 8, 512) and use(dtype, 5000, 1, 1)
    assert not use(dtype, 499, 8, 512)  # each bound, one past it
    assert not use(dtype, 500, 9, 512)
    assert not use(dtype, 500, 8, 513)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unset_no_float32_or_float64_call_takes_them(dtype):
    assert not use(dtype, 500, 8, 512)  # the float32 SIMT kernel measured slower at every size


def test_on_they_run_wherever_they_fit_and_off_nowhere(monkeypatch):
    cuda.persistent = True
    assert use(torch.float32, 10, 64, 4096) and use(torch.bfloat16, 2, 1, 2048)
    assert not use(torch.float16, 500, 65, 16)  # over the kernels' largest batch
    cuda.persistent = False
    assert not use(torch.bfloat16, 500, 8, 512)
    del cuda.persistent
    monkeypatch.setenv("PIPELSTM_PERSISTENT", "1")  # the variable, read at each call
    assert use(torch.float32, 10, 8, 256)
    monkeypatch.setenv("PIPELSTM_PERSISTENT", "auto")
    assert not use(torch.float32, 10, 8, 256) and use(torch.float16, 600, 4, 256)
