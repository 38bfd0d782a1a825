"""Whole-model torch.save / torch.load(weights_only=True) of models holding
pipelstm's modules (pipelstm/serialization.py): they load wherever the
nn.LSTM version loads, allowlisting only torch.nn classes and the user's own."""

import io
import os

import pytest
import torch
from torch import nn

import pipelstm


class Model(nn.Module):
    """The user's model: an embedding, a recurrent module, a decoder."""

    def __init__(self, recurrent: nn.Module, cell: nn.Module = None):
        super().__init__()
        self.emb = nn.Embedding(10, 3)
        self.lstm = recurrent
        self.cell = cell
        self.out = nn.Linear(4, 10)

    def forward(self, tokens):
        y = self.lstm(self.emb(tokens))[0]
        if self.cell is not None:
            y = y + self.cell(y[0])[0]
        return self.out(y)


def _round_trip(model, allow):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(buf)
    buf.seek(0)
    with torch.serialization.safe_globals(allow):
        return torch.load(buf), unsafe  # weights_only=True, the default


def _models(kind):
    """(the nn version, the pipelstm version) of one model, same weights."""
    torch.manual_seed(0)
    if kind == "lstm_and_cell":
        ref = Model(nn.LSTM(3, 4, num_layers=2), nn.LSTMCell(4, 4))
        ours = Model(pipelstm.LSTM(3, 4, num_layers=2), pipelstm.LSTMCell(4, 4))
    elif kind == "bidirectional_proj":
        ref = Model(nn.LSTM(3, 4, bidirectional=True, proj_size=2))
        ours = Model(pipelstm.LSTM(3, 4, bidirectional=True, proj_size=2))
    elif kind == "lstm_devices":
        ref = Model(nn.LSTM(3, 4, num_layers=2))
        ours = Model(pipelstm.LSTM(3, 4, num_layers=2, devices=["cpu", "cpu"], threads=1))
    else:
        raise AssertionError(kind)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


NN = [Model, nn.Embedding, nn.Linear, nn.LSTM, nn.LSTMCell]


@pytest.mark.parametrize("kind", ["lstm_and_cell", "bidirectional_proj", "lstm_devices"])
def test_loads_with_only_nn_and_user_classes_allowed(kind):
    ref, ours = _models(kind)
    tokens = torch.randint(0, 10, (5, 2))
    ref_loaded, ref_unsafe = _round_trip(ref, NN)
    loaded, unsafe = _round_trip(ours, NN)
    # Nothing beyond what the nn.LSTM version needs is left to the user.
    assert {u for u in unsafe if "pipelstm" not in u} == {u for u in ref_unsafe if "LSTM" not in u}
    assert not [u for u in unsafe if "pipelstm" in u] or all(
        u.split(".")[-1] in {c.__name__ for c in pipelstm.hooks.serialization.SAFE_GLOBALS} for u in unsafe if "pipelstm" in u
    )
    assert type(loaded.lstm) is type(ours.lstm)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), ours.state_dict().values()))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), ours(tokens))
        torch.testing.assert_close(loaded(tokens), ref_loaded(tokens), rtol=1e-5, atol=1e-6)


def test_pipeline_loads_and_trains_on():
    torch.manual_seed(0)
    pipe = pipelstm.Pipeline(nn.Sequential(nn.Embedding(10, 3), pipelstm.LSTM(3, 4, num_layers=2), nn.Linear(4, 10)),
                             devices=["cpu", "cpu"], chunks=2, threads=1)
    loaded, _ = _round_trip(pipe, [nn.Sequential, nn.Embedding, nn.Linear])
    tokens = torch.randint(0, 10, (6, 2))
    assert loaded.balance == pipe.balance
    out, _ = loaded(tokens)  # (output, (h_n, c_n)) as from the LSTM
    assert torch.equal(out, pipe(tokens)[0])
    out.sum().backward()  # the rebuilt engine runs the backward too
    assert all(p.grad is not None for p in loaded.parameters())


def test_thread_counts_above_this_machines_cpus_load_capped():
    # A checkpoint from a bigger machine loads here (nothing is lost); its
    # stages get at most this machine's CPUs.
    pipe = pipelstm.LSTM(3, 4, num_layers=2, devices=["cpu", "cpu"], threads=1)
    pipe.threads = [512, 1]
    loaded, _ = _round_trip(pipe, [])
    assert loaded.threads == [os.cpu_count(), 1]
    assert loaded(torch.randn(4, 2, 3))[0].shape == (4, 2, 4)


def test_without_the_registration_loading_fails():
    # The guard this file is about: with pipelstm's classes removed from the
    # allowlist, the weights-only unpickler refuses them.
    _, ours = _models("lstm_and_cell")
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    saved = torch.serialization.get_safe_globals()
    try:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals([g for g in saved if g not in pipelstm.hooks.serialization.SAFE_GLOBALS])
        with torch.serialization.safe_globals(NN), pytest.raises(Exception, match="pipelstm.lstm.LSTM"):
            torch.load(buf)
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved)


def test_a_cell_pickled_under_its_former_module_loads(monkeypatch):
    # LSTMCell lived in pipelstm/lstm.py; whole models saved then name it
    # pipelstm.lstm.LSTMCell.
    cell = pipelstm.LSTMCell(3, 4)
    monkeypatch.setattr(type(cell), "__module__", "pipelstm.lstm")
    buf = io.BytesIO()
    torch.save(cell, buf)
    monkeypatch.undo()
    assert b"pipelstm.lstm\nLSTMCell" in buf.getvalue()
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded) is pipelstm.LSTMCell
    x = torch.randn(2, 3)
    torch.testing.assert_close(loaded(x)[0], cell(x)[0])
