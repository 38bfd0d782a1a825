"""pipelstm.stack.wavefront: the layers of a stack as a wavefront over time chunks.

The streams need a GPU (tests/gpu/test_gpu_layer_wavefront.py); here the
chunking runs in order on the CPU and must give what the layers give one
after another (float64), values and gradients, and the switch must choose
it only where it applies.
"""

import pytest
import torch

import pipelstm
from pipelstm import ops
from pipelstm.stack import wavefront as layer_wavefront
from pipelstm.backends import cuda


def _stack(layers=3, I=5, H=7, seed=0):
    torch.manual_seed(seed)
    return pipelstm.LSTM(I, H, num_layers=layers, dtype=torch.float64)


def _layer(lstm):
    return lambda x, h, c, l: ops.lstm_layer(x, h, c, *lstm._layer_weights(l, False))


@pytest.mark.parametrize("chunks", [1, 2, 3, 11])
def test_chunks_in_order_equal_the_layers_one_after_another(chunks):
    lstm = _stack()
    T, B = 11, 4
    x = torch.randn(T, B, 5, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, B, 7, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(3, B, 7, dtype=torch.float64, requires_grad=True)
    want, (want_h, want_c) = lstm(x, (h0, c0))
    out, h, c = layer_wavefront.run_wavefront(x, list(h0.unbind(0)), list(c0.unbind(0)), _layer(lstm), chunks)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.stack(h), want_h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.stack(c), want_c, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    inputs = [x, h0, c0, *lstm.parameters()]
    want_grads = torch.autograd.grad((want * g).sum() + want_h.sum() + want_c.sum(), inputs)
    grads = torch.autograd.grad((out * g).sum() + torch.stack(h).sum() + torch.stack(c).sum(), inputs)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_dropout_applies_between_layers_only():
    lstm = _stack(layers=2)
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    zeros = [torch.zeros(3, 7, dtype=torch.float64)] * 2
    seen = []

    def layer(inp, h, c, l):
        seen.append((l, bool((inp == 0).any())))
        return _layer(lstm)(inp, h, c, l)

    layer_wavefront.run_wavefront(x, zeros, zeros, layer, 2, dropout=0.9, training=True)
    assert {l for l, dropped in seen if dropped} == {1}
    seen.clear()
    layer_wavefront.run_wavefront(x, zeros, zeros, layer, 2, dropout=0.9, training=False)
    assert not any(dropped for _, dropped in seen)


def test_chunks_out_of_range_are_refused():
    lstm = _stack(layers=2)
    x = torch.randn(4, 2, 5, dtype=torch.float64)
    zeros = [torch.zeros(2, 7, dtype=torch.float64)] * 2
    for chunks in (0, 5):
        with pytest.raises(ValueError, match=f"chunks must be between 1 and the sequence length 4, got {chunks}"):
            layer_wavefront.run_wavefront(x, zeros, zeros, _layer(lstm), chunks)


def test_a_bad_chunk_count_is_refused_naming_the_switch():
    for bad in (1, 5000):
        with pytest.raises(ValueError, match="PIPELSTM_LAYER_WAVEFRONT to '.*': it takes a whole number of time"):
            cuda.layer_wavefront = bad
    with pytest.raises(TypeError, match=r"layer_wavefront \(PIPELSTM_LAYER_WAVEFRONT\) must be an int"):
        cuda.layer_wavefront = 2.5
