"""Bad input to every op: a RuntimeError naming the argument, never a crash.

Each case runs eagerly and under FakeTensorMode (the fake kernels of
pipelstm/ops.py, which torch.compile and torch.export trace with): both must
refuse it with the same message.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import pipelstm  # noqa: F401

ops = torch.ops.pipelstm


@pytest.fixture(params=["eager", "fake"])
def call(request):
    """Calls an op on real tensors, or on fake copies of them under FakeTensorMode."""

    def run(op, **kw):
        if request.param == "eager":
            return op(**kw)
        mode = FakeTensorMode()
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        with mode:
            return op(**fake)

    return run
T, B, I, H, P = 4, 3, 5, 6, 2


def layer_args(**override):
    a = dict(
        input=torch.randn(T, B, I),
        h0=torch.randn(B, P),
        c0=torch.randn(B, H),
        w_ih=torch.randn(4 * H, I),
        w_hh=torch.randn(4 * H, P),
        b_ih=torch.randn(4 * H),
        b_hh=torch.randn(4 * H),
        w_hr=torch.randn(P, H),
        reverse=False,
    )
    a.update(override)
    return a


LAYER_CASES = {
    "input rank": (dict(input=torch.randn(T, I)), r"`input`.*3-D \[T, B, I\]"),
    "no time steps": (dict(input=torch.randn(0, B, I)), r"`input` with at least one time step"),
    "w_ih input size": (dict(w_ih=torch.randn(4 * H, I + 1)), r"`w_ih` of shape \[24, 5\]"),
    "w_ih not 4H": (dict(w_ih=torch.randn(4 * H + 1, I)), r"`w_ih` of shape \[4H, I\]"),
    "w_hh shape": (dict(w_hh=torch.randn(4 * H, H)), r"`w_hh` of shape \[24, 2\]"),
    "h0 batch": (dict(h0=torch.randn(B + 1, P)), r"`h0` of shape \[3, 2\]"),
    "c0 size": (dict(c0=torch.randn(B, P)), r"`c0` of shape \[3, 6\]"),
    "b_ih size": (dict(b_ih=torch.randn(H)), r"`b_ih` of shape \[24\]"),
    "w_hr shape": (dict(w_hr=torch.randn(P, H + 1)), r"`w_hr` of shape \[2, 6\]"),
    "h0 dtype": (dict(h0=torch.randn(B, P, dtype=torch.float64)), r"`h0` to have the dtype of `input`"),
    "w_hh dtype": (dict(w_hh=torch.randn(4 * H, P, dtype=torch.float64)), r"`w_hh` to have the dtype"),
    "integer input": (
        dict(input=torch.ones(T, B, I, dtype=torch.int32)),
        r"`input` must be float32, float16, bfloat16 or float64, got (Int|torch.int32)",
    ),
    "half input, float32 weights": (
        dict(input=torch.randn(T, B, I).half()),
        r"`w_hr` to have the dtype of `input`",
    ),
}


@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_layer_forward(case, call):
    override, pattern = LAYER_CASES[case]
    with pytest.raises(RuntimeError, match=pattern):
        call(ops.lstm_layer_forward, **layer_args(**override))


def test_layer_forward_device_mismatch():
    # Mixed meta/cpu dispatches to the fake kernel, which must refuse too.
    with pytest.raises(RuntimeError, match=r"`h0`.*device"):
        ops.lstm_layer_forward(**layer_args(h0=torch.randn(B, P, device="meta")))


def _forward():
    a = layer_args()
    out, h_n, c_n, ws = ops.lstm_layer_forward(**a)
    return a, out, h_n, c_n, ws


BACKWARD_CASES = {
    "workspace size": ("workspace", lambda ws, out: ws[:-1], r"`workspace` of shape"),
    "grad_output shape": ("grad_output", lambda ws, out: torch.randn(T, B, H), r"`grad_output` of shape \[4, 3, 2\]"),
    "grad_h_n shape": ("grad_h_n", lambda ws, out: torch.randn(B, H), r"`grad_h_n` of shape \[3, 2\]"),
    "grad_c_n dtype": ("grad_c_n", lambda ws, out: torch.randn(B, H).double(), r"`grad_c_n` to have the dtype"),
    "output shape": ("output", lambda ws, out: out[:-1], r"`output` of shape \[4, 3, 2\]"),
}


@pytest.mark.parametrize("case", list(BACKWARD_CASES))
def test_layer_backward(case, call):
    a, out, h_n, c_n, ws = _forward()
    kw = dict(
        grad_output=torch.randn_like(out),
        grad_h_n=None,
        grad_c_n=None,
        input=a["input"],
        h0=a["h0"],
        c0=a["c0"],
        w_ih=a["w_ih"],
        w_hh=a["w_hh"],
        w_hr=a["w_hr"],
        output=out,
        workspace=ws,
        reverse=False,
    )
    name, make, pattern = BACKWARD_CASES[case]
    kw[name] = make(ws, out)
    with pytest.raises(RuntimeError, match=pattern):
        call(ops.lstm_layer_backward, **kw)


CELL_CASES = {
    "cx rank": (dict(cx=torch.randn(B * H)), r"`cx` to be 2-D \[B, H\]"),
    "input_gates shape": (dict(input_gates=torch.randn(B, 4 * H + 1)), r"`input_gates` of shape \[3, 24\]"),
    "hidden_gates batch": (dict(hidden_gates=torch.randn(B + 1, 4 * H)), r"`hidden_gates` of shape \[3, 24\]"),
    "b_hh size": (dict(b_hh=torch.randn(H)), r"`b_hh` of shape \[24\]"),
    "dtype mix": (dict(input_gates=torch.randn(B, 4 * H).double()), r"`input_gates` to have the dtype of `cx`"),
}


@pytest.mark.parametrize("case", list(CELL_CASES))
def test_cell_forward(case, call):
    a = dict(
        input_gates=torch.randn(B, 4 * H),
        hidden_gates=torch.randn(B, 4 * H),
        cx=torch.randn(B, H),
        b_ih=torch.randn(4 * H),
        b_hh=torch.randn(4 * H),
    )
    override, pattern = CELL_CASES[case]
    a.update(override)
    with pytest.raises(RuntimeError, match=pattern):
        call(ops.lstm_cell_forward, **a)


def test_cell_backward_workspace_shape(call):
    cx = torch.randn(B, H)
    hy, cy, ws = ops.lstm_cell_forward(torch.randn(B, 4 * H), torch.randn(B, 4 * H), cx, None, None)
    with pytest.raises(RuntimeError, match=r"`workspace` of shape \[3, 24\]"):
        call(ops.lstm_cell_backward, grad_hy=hy, grad_cy=None, cx=cx, cy=cy, workspace=ws[:, :-1])
    with pytest.raises(RuntimeError, match=r"`grad_hy` of shape \[3, 6\]"):
        call(ops.lstm_cell_backward, grad_hy=hy[:, :-1], grad_cy=None, cx=cx, cy=cy, workspace=ws)
    with pytest.raises(RuntimeError, match=r"`cy` of shape \[3, 6\]"):
        call(ops.lstm_cell_backward, grad_hy=hy, grad_cy=None, cx=cx, cy=cy[:-1], workspace=ws)


PACKED_CASES = {
    "input rank": (dict(input=torch.randn(7, 2, I)), r"`input` to be 2-D \[rows, I\]"),
    "batch_sizes dtype": (dict(batch_sizes=torch.tensor([3.0, 2.0, 2.0])), r"`batch_sizes` to be a 1-D int64 CPU"),
    "batch_sizes empty": (dict(batch_sizes=torch.zeros(0, dtype=torch.int64)), r"`batch_sizes` with at least one"),
    "c0 batch": (dict(c0=torch.randn(B + 1, H)), r"`c0` of shape \[3, 6\]"),
    "w_hh shape": (dict(w_hh=torch.randn(4 * H, H)), r"`w_hh` of shape \[24, 2\]"),
    "b_hh dtype": (dict(b_hh=torch.randn(4 * H, dtype=torch.float64)), r"`b_hh` to have the dtype of `input`"),
}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_packed_layer_forward(case, call):
    a = layer_args(input=torch.randn(7, I), batch_sizes=torch.tensor([3, 2, 2]))
    override, pattern = PACKED_CASES[case]
    a.update(override)
    with pytest.raises(RuntimeError, match=pattern):
        call(ops.lstm_packed_layer_forward, **a)


def test_module_under_fake_tensors_rejects_a_bad_state_as_eager_does():
    # Found by fuzzing: the fake kernel accepted c0 [3, 4] with a batch of 2,
    # so compiled code traced past an error that eager raises.
    lstm = pipelstm.LSTM(3, 4)
    args = torch.randn(5, 2, 3), (torch.randn(1, 2, 4), torch.randn(1, 3, 4))
    with pytest.raises(RuntimeError, match=r"`c0` of shape \[2, 4\]"):
        ops.lstm_layer_forward(args[0], args[1][0][0], args[1][1][0], lstm.weight_ih_l0, lstm.weight_hh_l0,
                               None, None, None, False)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, pytest.raises(RuntimeError, match=r"`c0` of shape \[2, 4\]"):
        x, (h0, c0) = mode.from_tensor(args[0]), (mode.from_tensor(t) for t in args[1])
        ops.lstm_layer_forward(x, h0[0], c0[0], lstm.weight_ih_l0, lstm.weight_hh_l0, None, None, None, False)


def test_sizes_whose_products_overflow_are_refused():
    # Found by UBSan: `4 * H` (the cell op's checks) and the running sum of
    # batch_sizes (the layer op's step layout) overflowed int64 for expanded tensors.
    huge = 2**62
    with pytest.raises(RuntimeError, match=r"lstm_cell_forward: the gates, B x 4 x H, \[1, 4, 4611686018427387904\] overflows int64"):
        ops.lstm_cell_forward(torch.zeros(1, 4), torch.zeros(1, 4), torch.zeros(1).expand(1, huge), None, None)
    with pytest.raises(RuntimeError, match=r"the sum of `batch_sizes` overflows int64"):
        ops.lstm_packed_layer_forward(torch.zeros(3, 2), torch.tensor([huge, huge, huge]), torch.zeros(1, 1),
                                      torch.zeros(1, 1), torch.zeros(4, 2), torch.zeros(4, 1), None, None, None, False)
    with pytest.raises(RuntimeError, match=r"the workspace, rows x H x 6, .* overflows int64"):
        H = 2**60
        ops.lstm_layer_forward(torch.zeros(2, 1, 1), torch.zeros(1).expand(1, 1), torch.zeros(1).expand(1, H),
                               torch.zeros(1).expand(4 * H, 1), torch.zeros(1).expand(4 * H, 1), None, None,
                               torch.zeros(1).expand(1, H), False)

