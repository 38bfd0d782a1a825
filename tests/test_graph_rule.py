"""Where a CUDA layer call replays its time loop as a graph when
``PIPELSTM_CUDA_GRAPHS`` is unset (csrc/graph_rule.h): while the recurrent
GEMM's B*H*H is at most 2^26, or 2^28 on tensor cores (float16, bfloat16,
and float32 whose GEMMs run as TF32, as torch's defaults have them). The
rule is checked here, on any machine; the graphs themselves on a GPU in
tests/gpu/test_gpu_graphs.py.
"""

import pytest
import torch

import pipelstm

pays = pipelstm._C._graph_pays


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tf32", [False, True])
def test_tensor_cores_have_the_higher_bound(dtype, tf32):
    assert pays(dtype, tf32, 256, 1024)  # 2^28
    assert not pays(dtype, tf32, 257, 1024)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_without_tensor_cores_the_bound_is_lower(dtype):
    assert pays(dtype, False, 64, 1024)  # 2^26
    assert not pays(dtype, False, 65, 1024)
    assert not pays(dtype, False, 256, 1024)


def test_float32_on_tf32_takes_the_tensor_core_bound():
    assert pays(torch.float32, True, 256, 1024)
    assert pays(torch.float32, True, 512, 512)  # the 1-layer B=512 H=512 row of bench gpu
    assert not pays(torch.float32, True, 512, 1024)
    assert not pays(torch.float64, True, 256, 1024)  # no TF32 for float64
