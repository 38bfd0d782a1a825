"""Everything nn.LSTM rejects, pipelstm.LSTM rejects with the same exception type."""

import pytest
import torch
from torch import nn

import pipelstm

from nn_lstm_rejections import FORWARD_CASES, KW, T, B, assert_rejects_like_nn_lstm, zeros


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_rejects_like_nn_lstm(case):
    assert_rejects_like_nn_lstm(case, pipelstm.LSTM)


def test_hidden_dtype_mismatch_is_rejected():
    x = zeros(T, B, 3)
    hx = (zeros(2, B, 4, dtype=torch.float64), zeros(2, B, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError) as ref_error:
        nn.LSTM(**KW)(x, hx)
    with pytest.raises(ref_error.type, match=r"`h0` to have the dtype of `input`"):
        pipelstm.LSTM(**KW)(x, hx)


def test_device_mismatch_is_rejected_before_any_work():
    m = pipelstm.LSTM(**KW)
    m.weight_ih_l1 = nn.Parameter(torch.zeros(16, 4, device="meta"))
    with pytest.raises(RuntimeError, match=r"not at the same device.*cpu.*meta"):
        m(zeros(T, B, 3))


CONSTRUCTOR_CASES = {
    "proj_size >= hidden_size": dict(input_size=3, hidden_size=4, proj_size=4),
    "negative proj_size": dict(input_size=3, hidden_size=4, proj_size=-1),
    "hidden_size 0": dict(input_size=3, hidden_size=0),
    "num_layers 0": dict(input_size=3, hidden_size=4, num_layers=0),
    "dropout > 1": dict(input_size=3, hidden_size=4, dropout=1.5),
    "dropout < 0": dict(input_size=3, hidden_size=4, dropout=-0.1),
    "hidden_size not int": dict(input_size=3, hidden_size=4.5),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_constructor_rejects_like_nn_lstm(case):
    kw = CONSTRUCTOR_CASES[case]
    with pytest.raises(Exception) as ref_error:
        nn.LSTM(**kw)
    with pytest.raises(ref_error.type) as ours:
        pipelstm.LSTM(**kw)
    assert str(ours.value) == str(ref_error.value)


CELL_CASES = {
    "3-D input": (lambda: (zeros(2, 3, 1),), r"Expected input to be 1D or 2D"),
    "input_size": (lambda: (zeros(2, 5),), r"input has inconsistent input_size: got 5 expected 3"),
    "hx batch": (lambda: (zeros(2, 3), (zeros(3, 4), zeros(3, 4))), r"doesn't match hidden0 batch size"),
    "hx size": (lambda: (zeros(2, 3), (zeros(2, 4), zeros(2, 5))), r"hidden1 has inconsistent hidden_size"),
    "hx 3-D": (lambda: (zeros(2, 3), (zeros(1, 2, 4), zeros(1, 2, 4))), r"Expected hx\[0\] to be 1D or 2D"),
}


@pytest.mark.parametrize("case", list(CELL_CASES))
def test_cell_rejects_like_nn_lstm_cell(case):
    make_args, pattern = CELL_CASES[case]
    with pytest.raises(Exception) as ref_error:
        nn.LSTMCell(3, 4)(*make_args())
    with pytest.raises(ref_error.type, match=pattern):
        pipelstm.LSTMCell(3, 4)(*make_args())


# --- the differential check: every bad call, torch against pipelstm -----------------

from nn_lstm_rejections import ACCIDENTAL, STRICTER, bad_calls, compare, outcome  # noqa: E402

OURS = {"LSTM": pipelstm.LSTM, "LSTMCell": pipelstm.LSTMCell}
CALLS = bad_calls()


@pytest.mark.parametrize("case", sorted({c.case for c in CALLS}))
def test_bad_input_raises_what_torch_raises(case):
    # Every configuration of the case: the same exception type where torch
    # raises (ACCIDENTAL's where torch fails by accident), and a result
    # where torch gives one, except in STRICTER's cases.
    mismatches = [m for c in CALLS if c.case == case for m in [compare(c, OURS)] if m is not None]
    assert not mismatches, "\n".join(mismatches)


def test_the_lists_of_differences_are_exact():
    # Each documented difference still happens (a stale entry would hide a change).
    stricter, accidental = set(), set()
    for c in CALLS:
        if c.case not in STRICTER and c.case not in ACCIDENTAL:
            continue
        ref_module, ours = getattr(nn, c.module)(**c.kw), OURS[c.module](**c.kw)
        ours.load_state_dict(ref_module.state_dict())
        ref, got = outcome(lambda: ref_module(*c.make_args())), outcome(lambda: ours(*c.make_args()))
        if ref is None and got is not None:
            stricter.add(c.case)
        if ref is not None and got is not None and type(ref) is not type(got):
            accidental.add(c.case)
    assert stricter == set(STRICTER)
    assert accidental == set(ACCIDENTAL)


def test_a_state_of_another_dtype_than_a_float64_module_is_refused():
    # nn.LSTM (float64) computes with a float32 c_0; pipelstm refuses it
    # rather than mix precisions (README, "What differs").
    kw = dict(input_size=3, hidden_size=4)
    x, h0, c0 = torch.randn(5, 2, 3, dtype=torch.float64), torch.randn(1, 2, 4, dtype=torch.float64), torch.randn(1, 2, 4)
    nn.LSTM(**kw).double()(x, (h0, c0))
    with pytest.raises(RuntimeError, match=r"expected `c0` to have the dtype of `input` \(Double\), got Float"):
        pipelstm.LSTM(**kw).double()(x, (h0, c0))
