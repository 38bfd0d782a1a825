"""The forward calls nn.LSTM rejects, shared by the tests of every module
that must reject them the same way (pipelstm.LSTM, LSTM(devices=))."""

import pytest
import torch
from torch import nn

KW = dict(input_size=3, hidden_size=4, num_layers=2)
T, B = 5, 2


def zeros(*s, **kw):
    return torch.zeros(*s, **kw)


FORWARD_CASES = {
    "4-D input": (KW, lambda: (zeros(T, B, 3, 1),), r"Expected input to be 2D or 3D"),
    "1-D input": (KW, lambda: (zeros(3),), r"Expected input to be 2D or 3D"),
    "input_size mismatch": (KW, lambda: (zeros(T, B, 5),), r"input.size\(-1\) must be equal to input_size"),
    "h0 layers": (KW, lambda: (zeros(T, B, 3), (zeros(1, B, 4), zeros(2, B, 4))), r"Expected hidden\[0\] size"),
    "h0 batch differs": (KW, lambda: (zeros(T, B, 3), (zeros(2, B + 1, 4), zeros(2, B + 1, 4))), r"Expected hidden\[0\] size"),
    "c0 size": (KW, lambda: (zeros(T, B, 3), (zeros(2, B, 4), zeros(2, B, 3))), r"Expected hidden\[1\] size"),
    "2-D hx for batched input": (KW, lambda: (zeros(T, B, 3), (zeros(B, 4), zeros(B, 4))), r"should also be 3-D"),
    "3-D hx for unbatched input": (KW, lambda: (zeros(T, 3), (zeros(2, 1, 4), zeros(2, 1, 4))), r"should also be 2-D"),
    "hx not a tuple": (KW, lambda: (zeros(T, B, 3), zeros(2, B, 4)), r"hx"),
    "input dtype": (KW, lambda: (zeros(T, B, 3, dtype=torch.float64),), r"input dtype \(torch.float64\) does not match weight dtype"),
    "proj hx size": (dict(KW, proj_size=2), lambda: (zeros(T, B, 3), (zeros(2, B, 4), zeros(2, B, 4))), r"Expected hidden\[0\] size \(2, 2, 2\)"),
}


def assert_rejects_like_nn_lstm(case, make_ours):
    """FORWARD_CASES[case] fails in `make_ours(**kw)` as in nn.LSTM: the same
    exception type, a message matching the case's pattern."""
    kw, make_args, pattern = FORWARD_CASES[case]
    with pytest.raises(Exception) as ref_error:
        nn.LSTM(**kw)(*make_args())
    with pytest.raises(ref_error.type, match=pattern):
        make_ours(**kw)(*make_args())
