"""pipelstm.awd_state_dict: checkpoints saved the way AWD-LSTM's weight drop
(salesforce/awd-lstm-lm's WeightDrop) and fastai's WeightDropout save
them load into a model holding pipelstm.LSTM(weight_dropout=...), which
then computes what the wrapped nn.LSTM computed in evaluation."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipelstm


class SalesforceWeightDrop(nn.Module):
    """As awd-lstm-lm's WeightDrop: the raw weight registered on the LSTM itself."""

    def __init__(self, module: nn.LSTM, p: float) -> None:
        super().__init__()
        self.module, self.p = module, p
        w = module.weight_hh_l0
        del module._parameters["weight_hh_l0"]
        module.register_parameter("weight_hh_l0_raw", nn.Parameter(w.data))

    def forward(self, x):
        raw = self.module.weight_hh_l0_raw
        setattr(self.module, "weight_hh_l0", F.dropout(raw, self.p, self.training) if self.training else raw * 1)
        return self.module(x)


class FastaiWeightDropout(nn.Module):
    """As fastai's WeightDropout: the raw weight on the wrapper, the dropped
    copy kept on the LSTM as a buffer (saved too)."""

    def __init__(self, module: nn.LSTM, p: float) -> None:
        super().__init__()
        self.module, self.p = module, p
        w = module.weight_hh_l0
        self.register_parameter("weight_hh_l0_raw", nn.Parameter(w.data))
        del module._parameters["weight_hh_l0"]
        module.register_buffer("weight_hh_l0", w.data.clone() * 0.5)  # a stale dropped copy

    def forward(self, x):
        self.module._buffers["weight_hh_l0"] = (F.dropout(self.weight_hh_l0_raw, self.p, self.training)
                                                if self.training else self.weight_hh_l0_raw * 1)
        return self.module(x)


class Model(nn.Module):
    def __init__(self, rnns) -> None:
        super().__init__()
        self.encoder = nn.Embedding(20, 6)
        self.rnns = nn.ModuleList(rnns)
        self.decoder = nn.Linear(8, 20)

    def forward(self, tokens):
        x = self.encoder(tokens)
        for rnn in self.rnns:
            x = rnn(x)[0]
        return self.decoder(x)


@pytest.mark.parametrize("wrapper", [SalesforceWeightDrop, FastaiWeightDropout])
def test_an_awd_checkpoint_loads_and_computes_the_same(wrapper):
    torch.manual_seed(0)
    awd = Model([wrapper(nn.LSTM(6 if l == 0 else 8, 8), 0.5) for l in range(3)]).eval()
    state = awd.state_dict()
    assert any(k.endswith("weight_hh_l0_raw") for k in state)
    ours = Model([pipelstm.LSTM(6 if l == 0 else 8, 8, weight_dropout=0.5) for l in range(3)]).eval()
    converted = pipelstm.awd_state_dict(state)
    ours.load_state_dict(converted)  # strict: every key and no other
    assert "rnns.1.weight_hh_l0" in converted and converted["rnns.1.weight_hh_l0"] is state[
        "rnns.1.module.weight_hh_l0_raw" if wrapper is SalesforceWeightDrop else "rnns.1.weight_hh_l0_raw"]
    tokens = torch.randint(0, 20, (7, 3))
    torch.testing.assert_close(ours.double()(tokens), awd.double()(tokens), rtol=0, atol=1e-12)


def test_keys_outside_the_wrappers_are_unchanged_and_a_missing_lstm_is_named():
    state = {"encoder.weight": torch.zeros(2), "rnn.module.weight_ih_l0": torch.zeros(1),
             "rnn.module.weight_hh_l0_raw": torch.ones(1), "rnn.module.bias_ih_l0": torch.zeros(1)}
    assert list(pipelstm.awd_state_dict(state)) == ["encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0",
                                                    "rnn.bias_ih_l0"]
    with pytest.raises(ValueError, match=r"'rnn\.weight_hh_l0_raw' is a raw recurrent weight, but the checkpoint "
                                         r"has no 'rnn\.module\.weight_ih_l0' beside it"):
        pipelstm.awd_state_dict({"rnn.weight_hh_l0_raw": torch.ones(1)})
