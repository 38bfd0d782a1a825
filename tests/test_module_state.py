"""pipelstm.LSTM's state and structure: torch.save / torch.load and deepcopy
bitwise, state_dict both ways with nn.LSTM, repr, _flat_weights /
all_weights / flatten_parameters and the class hierarchy. (Whole-model
torch.load(weights_only=True) of models holding pipelstm's modules:
test_serialization.py.)

The reference is always independent of pipelstm: nn.LSTM holding the same
weights (load_state_dict), or the same module run eagerly.
"""

import copy
import io

import pytest
import torch
from torch import nn

import pipelstm
from lstm_pairs import KW, pair
from reference import rel_error

CONFIGS = {
    "plain": dict(input_size=4, hidden_size=6),
    "bidirectional_proj": KW,
    "no_bias_batch_first_dropout": dict(input_size=4, hidden_size=5, num_layers=3, bias=False, batch_first=True, dropout=0.25),
}


def test_save_load_whole_module_and_state_dict_bitwise():
    _, ours = pair()
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded) is pipelstm.LSTM
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert list(state) == list(ours.state_dict())
    assert all(torch.equal(state[k], v) for k, v in ours.state_dict().items())
    fresh = pipelstm.LSTM(**KW)
    fresh.load_state_dict(state, strict=True)
    clone = copy.deepcopy(ours)
    x = torch.randn(5, 2, 4)
    out, (h, c) = ours(x)
    for m in (loaded, fresh, clone):
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ours.state_dict().values()))
        out2, (h2, c2) = m(x)
        assert torch.equal(out2, out) and torch.equal(h2, h) and torch.equal(c2, c)
    # deepcopy is independent of the original.
    with torch.no_grad():
        clone.weight_ih_l0.add_(1.0)
    assert not torch.equal(clone.weight_ih_l0, ours.weight_ih_l0)
    assert torch.equal(ours(x)[0], out)


@pytest.mark.parametrize("config", CONFIGS)
def test_state_dict_both_ways_and_repr(config):
    kw = CONFIGS[config]
    ref, ours = nn.LSTM(**kw), pipelstm.LSTM(**kw)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert repr(ours) == repr(ref)
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values()))
    ours2 = pipelstm.LSTM(**kw)
    ref.load_state_dict(ours2.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(ours2.state_dict().values(), ref.state_dict().values()))
    ours.eval(), ref.eval()
    x = torch.randn(2, 5, 4) if kw.get("batch_first") else torch.randn(5, 2, 4)
    ours.load_state_dict(ref.state_dict())
    assert rel_error(ours(x)[0], ref(x)[0]) <= 1e-5


def test_flat_weights_all_weights_flatten_parameters_and_class():
    ref, ours = pair()
    assert ours._flat_weights_names == ref._flat_weights_names
    assert len(ours._flat_weights) == len(ref._flat_weights)
    assert all(torch.equal(a, b) for a, b in zip(ours._flat_weights, ref._flat_weights))
    assert all(w is getattr(ours, n) for w, n in zip(ours._flat_weights, ours._flat_weights_names))
    assert len(ours.all_weights) == len(ref.all_weights)
    for layer, layer_ref in zip(ours.all_weights, ref.all_weights):
        assert len(layer) == len(layer_ref)
        assert all(isinstance(w, nn.Parameter) and torch.equal(w, w_r) for w, w_r in zip(layer, layer_ref))
    x = torch.randn(5, 2, 4)
    out = ours(x)[0]
    assert ours.flatten_parameters() is None and ref.flatten_parameters() is None
    assert all(w is getattr(ours, n) for w, n in zip(ours._flat_weights, ours._flat_weights_names))
    assert torch.equal(ours(x)[0], out)
    assert isinstance(ours, nn.RNNBase) and not isinstance(ours, nn.LSTM)
    assert isinstance(pipelstm.LSTMCell(3, 4), nn.RNNCellBase)
