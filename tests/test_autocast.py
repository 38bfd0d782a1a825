"""pipelstm/autocast.py: the ops' autocast rules.

The CUDA rule runs for real in tests/gpu/test_gpu_autocast.py (against
nn.LSTM under torch.autocast("cuda")). Here, without a GPU: the casting it
shares with every rule, on CPU tensors against the same op given cast
inputs, and that the CUDA rule reads autocast's dtype at each call. The
CPU rule end to end: test_module_dtype_device.py.
"""

import pytest
import torch

import pipelstm
from pipelstm.hooks import autocast

OPS = torch.ops.pipelstm


def _layer_args(dtype=torch.float32):
    T, B, I, H = 4, 3, 5, 6
    return (torch.randn(T, B, I, dtype=dtype), torch.randn(B, H, dtype=dtype), torch.randn(B, H, dtype=dtype),
            torch.randn(4 * H, I, dtype=dtype), torch.randn(4 * H, H, dtype=dtype), torch.randn(4 * H, dtype=dtype),
            None, None, False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cast_and_call_runs_the_op_on_inputs_cast_to_the_dtype(dtype):
    # The ATen composition runs in any dtype on the CPU: the rule's casting
    # is seen in its results.
    args = _layer_args()
    got = autocast.cast_and_call(OPS.lstm_layer_composite.default, "cpu", dtype, args)
    cast = tuple(a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args)
    expected = OPS.lstm_layer_composite(*cast)
    for g, e in zip(got, expected):
        assert g.dtype == dtype
        assert torch.equal(g, e)


def test_cast_and_call_leaves_float64_and_integer_tensors_alone():
    seen = []
    args = (torch.randn(2), torch.randn(2, dtype=torch.float64), torch.arange(3), None, True)
    autocast.cast_and_call(lambda *a: seen.extend(a), "cpu", torch.bfloat16, args)
    assert [getattr(a, "dtype", a) for a in seen] == [torch.bfloat16, torch.float64, torch.int64, None, True]


def test_cast_and_call_turns_autocast_off_inside_the_op():
    # The op's own ATen calls (the input projection) must run in the dtype
    # the op was given, not be cast again.
    def op(x):
        return torch.is_autocast_enabled("cpu"), torch.mm(x, x).dtype

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast.cast_and_call(op, "cpu", torch.float32, (torch.randn(2, 2),)) == (False, torch.float32)


@pytest.mark.parametrize("name", autocast.FORWARD_OPS)
def test_every_forward_op_has_a_cpu_and_a_cuda_rule(name):
    for key in ("AutocastCPU", "AutocastCUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pipelstm::{name}", key)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_cuda_rule_casts_to_the_dtype_autocast_was_entered_with(dtype, monkeypatch):
    calls = []
    monkeypatch.setattr(autocast, "cast_and_call", lambda op, device, dt, args: calls.append((op, device, dt)))
    before = torch.get_autocast_dtype("cuda")
    torch.set_autocast_dtype("cuda", dtype)
    try:
        op = OPS.lstm_layer_forward.default
        op.py_kernels[torch._C.DispatchKey.AutocastCUDA](*_layer_args())
    finally:
        torch.set_autocast_dtype("cuda", before)
    assert calls == [(op, "cuda", dtype)]


def test_cpu_autocast_runs_the_module_in_float32():
    # nn.LSTM under CPU autocast runs oneDNN in bfloat16 (where the CPU has
    # it); pipelstm's CPU kernels take float32: the same result as no autocast.
    m = pipelstm.LSTM(5, 6, num_layers=2)
    x = torch.randn(4, 3, 5)
    expected = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = m(x)
    assert got[0].dtype == torch.float32
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1][0], expected[1][0])
