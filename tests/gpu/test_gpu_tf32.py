"""The precision of a float32 LSTM on CUDA: TF32 exactly where nn.LSTM's
cuDNN path uses it (torch.backends.cudnn.allow_tf32, on by default),
whatever torch.backends.cuda.matmul.allow_tf32 says (csrc/layer_gemm.h).

TF32 keeps 10 mantissa bits: its products are off by about 1e-4..1e-3 of
the result, float32's by about 1e-6. So the error against a float64
reference tells which one ran. With TF32 allowed pipelstm must be about as
accurate as cuDNN's own TF32 LSTM; with it refused, within float32's error,
also while the matmul switch allows TF32. Each setting is run with CUDA
graphs on and off, and switched back and forth in one process (a graph
captured under one setting must not be replayed under the other).
"""

import pytest
import torch
from torch import nn

import pipelstm
from reference import rel_error

pytestmark = pytest.mark.gpu

T, B, H, LAYERS = 50, 16, 256, 2


def _models():
    torch.manual_seed(0)
    ref = nn.LSTM(H, H, num_layers=LAYERS).cuda()
    ours = pipelstm.LSTM(H, H, num_layers=LAYERS).cuda()
    ours.load_state_dict(ref.state_dict())
    ref64 = nn.LSTM(H, H, num_layers=LAYERS).cuda().double()
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    return ref, ours, ref64


def _errors(model, x, expected_out, expected_grad):
    x = x.clone().requires_grad_()
    out, _ = model(x)
    out.backward(torch.ones_like(out))
    return rel_error(out.double(), expected_out), rel_error(x.grad.double(), expected_grad)


def _set(cudnn: bool, matmul: bool) -> None:
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.backends.cuda.matmul.allow_tf32 = matmul


@pytest.mark.parametrize("graphs", ["0", "1"])
def test_float32_layers_use_tf32_exactly_when_cudnn_would(monkeypatch, graphs):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", graphs)
    ref, ours, ref64 = _models()
    x = torch.randn(T, B, H, device="cuda")
    x64 = x.double().requires_grad_()
    out64, _ = ref64(x64)
    out64.backward(torch.ones_like(out64))
    expected = (out64.detach(), x64.grad)

    _set(cudnn=True, matmul=False)  # torch's defaults
    cudnn_tf32 = _errors(ref, x, *expected)
    tf32 = _errors(ours, x, *expected)
    _set(cudnn=False, matmul=True)  # the matmul switch must not matter
    exact = _errors(ours, x, *expected)
    _set(cudnn=True, matmul=False)
    tf32_again = _errors(ours, x, *expected)

    for which in range(2):  # output, input gradient
        assert exact[which] < 1e-5, f"TF32 refused, yet error {exact[which]:.3g}"
        assert tf32[which] > 10 * exact[which], f"TF32 allowed, yet float32's error ({tf32[which]:.3g})"
        assert tf32[which] < 3 * cudnn_tf32[which] + 1e-6, (
            f"TF32 error {tf32[which]:.3g} against cuDNN's {cudnn_tf32[which]:.3g}")
        assert tf32_again[which] == pytest.approx(tf32[which], rel=0.05)
