"""TorchScript: torch.jit.trace records pipelstm's fused ops; torch.jit.script
compiles torch's nn.LSTM / nn.LSTMCell in their place, on the same
parameter tensors (export.as_torch_module), as a model of torch's modules
scripts, and torch swaps them into the scripted model (with a warning). A
pipelined LSTM is refused by name."""

import warnings
from typing import Tuple

import pytest
import torch
from torch import Tensor, nn

import pipelstm

x = torch.randn(5, 2, 3)


class Model(nn.Module):
    def __init__(self, lstm: nn.Module, cell: nn.Module) -> None:
        super().__init__()
        self.lstm, self.cell = lstm, cell

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        out, _ = self.lstm(x)
        h, _ = self.cell(x[0])
        return out, h


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated in torch itself
        yield


@pytest.mark.parametrize("kw", [dict(), dict(num_layers=2, bidirectional=True, proj_size=2, batch_first=True)])
def test_trace_records_the_module(kw):
    lstm = pipelstm.LSTM(3, 4, **kw)
    traced = torch.jit.trace(lstm, x)
    for a, b in zip(traced(x)[1] + (traced(x)[0],), lstm(x)[1] + (lstm(x)[0],)):
        torch.testing.assert_close(a, b)


def test_script_compiles_torchs_modules_on_the_same_parameters():
    ours = Model(pipelstm.LSTM(3, 4, num_layers=2, bidirectional=True), pipelstm.LSTMCell(3, 4))
    ref = Model(nn.LSTM(3, 4, num_layers=2, bidirectional=True), nn.LSTMCell(3, 4))
    ref.load_state_dict(ours.state_dict())
    lstm = ours.lstm
    with pytest.warns(UserWarning, match=r"torch\.jit\.script compiles torch's LSTM in place of pipelstm's"):
        scripted = torch.jit.script(ours)
    for a, b in zip(scripted(x), ref(x)):
        torch.testing.assert_close(a, b)
    assert type(ours.lstm) is nn.LSTM and ours.lstm.weight_hh_l0 is lstm.weight_hh_l0  # torch's swap
    with torch.no_grad():
        ours.lstm.weight_hh_l0.mul_(2.0)  # the scripted model reads the same tensors
        ref.lstm.weight_hh_l0.mul_(2.0)
    torch.testing.assert_close(scripted(x)[0], ref(x)[0])


def test_a_pipelined_lstm_is_not_scripted():
    model = Model(pipelstm.LSTM(3, 4, num_layers=2, devices=["cpu", "cpu"]), pipelstm.LSTMCell(3, 4))
    with pytest.raises(RuntimeError, match=r"torch\.jit\.script of an LSTM pipelined over devices=\[\.\.\.\] is not"):
        torch.jit.script(model)
