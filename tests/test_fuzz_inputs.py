"""Property-based tests (hypothesis) over the ops' and the modules' inputs.

Shapes (zero-size included), strides (non-contiguous views), dtypes,
devices (meta), one argument broken at a time, and batch_sizes of every
kind. Every call either matches the float64 reference (tests/reference.py,
nn.LSTM) or raises a Python exception: never a crash, a hang, or a result
for input that has none. Derandomized: CI runs the same examples each time.
"""

from typing import Dict, List, Optional

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import nn

import pipelstm
from reference import cell, layer, packed_layer, rel_error

FUZZ = settings(max_examples=400, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 3e-2, torch.float16: 5e-3}
BREAKS = ["grow", "shrink", "rank", "dtype", "int", "meta"]


def _tensor(shape: List[int], dtype: torch.dtype, strided: bool) -> torch.Tensor:
    """Random values in ``shape``; ``strided``: a non-contiguous view."""
    if strided and shape:
        wide = torch.randn(*shape[:-1], 2 * shape[-1] + 1, dtype=torch.float64) * 0.7
        return wide[..., 1::2].to(dtype)
    return (torch.randn(*shape, dtype=torch.float64) * 0.7).to(dtype)


def _error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """rel_error, 0 for empty tensors."""
    return rel_error(actual.double(), expected) if expected.numel() else 0.0


def _break(t: torch.Tensor, how: str) -> torch.Tensor:
    if how == "grow":
        return torch.cat([t, t[..., :1] if t.shape[-1] else torch.zeros(*t.shape[:-1], 1, dtype=t.dtype)], -1)
    if how == "shrink":
        return t[..., 1:] if t.shape[-1] else torch.zeros(*t.shape[:-1], 1, dtype=t.dtype)
    if how == "rank":
        return t.unsqueeze(0)
    if how == "dtype":
        return t.to(torch.float64 if t.dtype != torch.float64 else torch.float32)
    if how == "int":
        return t.to(torch.int32)
    if how == "meta":
        return t.to("meta")
    raise AssertionError(how)


@st.composite
def layer_arguments(draw):
    """(kwargs of pipelstm.ops.lstm_layer, whether they are valid, dtype,
    how an argument was broken or None)."""
    T, B, I, H = (draw(st.integers(0, 4)), draw(st.integers(0, 3)), draw(st.integers(0, 4)),
                  draw(st.integers(0, 4)))
    P = draw(st.integers(1, H - 1)) if H > 1 and draw(st.booleans()) else 0
    bias = draw(st.booleans())
    dtype = draw(st.sampled_from(DTYPES))
    Hout = P or H
    shapes: Dict[str, Optional[List[int]]] = dict(
        input=[T, B, I], h0=[B, Hout], c0=[B, H], w_ih=[4 * H, I], w_hh=[4 * H, Hout],
        b_ih=[4 * H] if bias else None, b_hh=[4 * H] if bias else None, w_hr=[P, H] if P else None,
    )
    args = {k: None if s is None else _tensor(s, dtype, draw(st.booleans())) for k, s in shapes.items()}
    broken = draw(st.sampled_from([None, None, None] + [k for k, v in args.items() if v is not None]))
    how = None
    if broken is not None:
        how = draw(st.sampled_from(BREAKS))
        args[broken] = _break(args[broken], how)
    valid = broken is None and H > 0 and T > 0
    args["reverse"] = draw(st.booleans())
    return args, valid, dtype, how


def _leaves(args):
    return {k: v.detach().double().requires_grad_() for k, v in args.items() if isinstance(v, torch.Tensor)}


def _check_against_reference(got, args, reverse, dtype, reference):
    ref_args = _leaves(args)
    expected = reference(ref_args["input"], **{k: v for k, v in ref_args.items() if k != "input"}, reverse=reverse)
    for g, e in zip(got, expected):
        assert g.dtype == dtype and g.shape == e.shape
        assert _error(g, e) <= TOL[dtype]
    if dtype not in (torch.float32, torch.float64) or expected[0].numel() == 0:
        return
    weights = [torch.randn(e.shape, dtype=torch.float64) for e in expected]
    sum((g.double() * w).sum() for g, w in zip(got, weights)).backward()
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    for k, leaf in ref_args.items():
        assert _error(args[k].grad, leaf.grad) <= TOL[dtype] * 10, k


def _expect_error(call):
    event("refused")  # --hypothesis-show-statistics: how many examples were bad input
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        call()


@FUZZ
@given(layer_arguments())
def test_layer_op_matches_the_reference_or_raises(case):
    args, valid, dtype, _ = case
    if not valid:
        _expect_error(lambda: pipelstm.ops.lstm_layer(**args))
        return
    if dtype in (torch.float32, torch.float64):
        for v in args.values():
            if isinstance(v, torch.Tensor):
                v.requires_grad_()
    got = pipelstm.ops.lstm_layer(**args)
    _check_against_reference(got, {k: v for k, v in args.items() if k != "reverse"}, args["reverse"], dtype, layer)


@FUZZ
@given(layer_arguments())
def test_layer_op_on_meta_tensors_gives_the_real_shapes_or_raises(case):
    args, valid, dtype, how = case
    if how == "meta":
        return  # every tensor goes to meta here: that break is no break
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    if not valid:
        _expect_error(lambda: pipelstm.ops.lstm_layer(**meta))
        return
    got = pipelstm.ops.lstm_layer(**meta)
    expected = layer(args["input"].double(),
                     **{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in args.items() if k != "input"})
    assert [g.shape for g in got] == [e.shape for e in expected]
    assert all(g.device.type == "meta" for g in got)


@st.composite
def batch_sizes_case(draw):
    """(batch_sizes, whether it is a valid PackedSequence layout)."""
    steps = draw(st.integers(1, 4))
    sizes = sorted(draw(st.lists(st.integers(1, 3), min_size=steps, max_size=steps)), reverse=True)
    kind = draw(st.sampled_from(["valid", "valid", "valid", "increasing", "zero", "negative", "float", "2d",
                                 "empty", "int32"]))
    if kind == "increasing" and len(set(sizes)) > 1:
        return torch.tensor(sizes[::-1]), False, sizes[::-1]
    if kind == "zero":
        return torch.tensor(sizes + [0]), False, sizes + [0]
    if kind == "negative":
        return torch.tensor(sizes + [-1]), False, sizes + [-1]
    if kind == "float":
        return torch.tensor(sizes, dtype=torch.float32), False, sizes
    if kind == "2d":
        return torch.tensor([sizes]), False, sizes
    if kind == "empty":
        return torch.zeros(0, dtype=torch.int64), False, []
    if kind == "int32":
        return torch.tensor(sizes, dtype=torch.int32), False, sizes
    return torch.tensor(sizes), True, sizes


@FUZZ
@given(batch_sizes_case(), st.integers(1, 4), st.integers(1, 3), st.booleans(), st.sampled_from(DTYPES),
       st.integers(-1, 1), st.integers(-1, 1))
def test_packed_layer_op_matches_the_reference_or_raises(bs_case, H, I, reverse, dtype, row_shift, batch_shift):
    batch_sizes, valid, sizes = bs_case
    rows = max(sum(s for s in sizes if s > 0) + row_shift, 0)
    B = max((sizes[0] if sizes else 1) + batch_shift, 0)
    valid = valid and row_shift == 0 and batch_shift == 0
    x = _tensor([rows, I], dtype, False)
    w = dict(w_ih=_tensor([4 * H, I], dtype, True), w_hh=_tensor([4 * H, H], dtype, False),
             b_ih=_tensor([4 * H], dtype, False), b_hh=None, w_hr=None)
    h0, c0 = _tensor([B, H], dtype, True), _tensor([B, H], dtype, False)
    call = lambda: pipelstm.ops.lstm_packed_layer(x, batch_sizes, h0, c0, **w, reverse=reverse)  # noqa: E731
    if not valid:
        _expect_error(call)
        return
    got = call()
    expected = packed_layer(x.double(), sizes, h0.double(), c0.double(), reverse,
                            **{k: None if v is None else v.double() for k, v in w.items()})
    for g, e in zip(got, expected):
        assert g.dtype == dtype and g.shape == e.shape
        assert _error(g, e) <= TOL[dtype]


@FUZZ
@given(st.integers(0, 3), st.integers(0, 4), st.sampled_from(DTYPES), st.booleans(),
       st.sampled_from([None, None, "input_gates", "hidden_gates", "cx", "b_ih"]), st.sampled_from(BREAKS))
def test_cell_op_matches_the_reference_or_raises(B, H, dtype, strided, broken, how):
    args = dict(input_gates=_tensor([B, 4 * H], dtype, strided), hidden_gates=_tensor([B, 4 * H], dtype, False),
                cx=_tensor([B, H], dtype, strided), b_ih=_tensor([4 * H], dtype, False), b_hh=None)
    if broken is not None:
        args[broken] = _break(args[broken], how)
    if broken is not None and not (how in ("grow", "shrink") and B == 0 and broken != "b_ih" and H == 0):
        _expect_error(lambda: pipelstm.ops.lstm_cell(**args))
        return
    if broken is not None:
        return  # a size change of an empty tensor that leaves it consistent: nothing to check
    hy, cy = pipelstm.ops.lstm_cell(**args)
    gates = args["input_gates"].double() + args["hidden_gates"].double() + args["b_ih"].double()
    h_ref, c_ref = cell(gates, args["cx"].double())
    for g, e in ((hy, h_ref), (cy, c_ref)):
        assert g.dtype == dtype and g.shape == e.shape and _error(g, e) <= TOL[dtype]


@st.composite
def module_case(draw):
    kw = dict(input_size=draw(st.integers(1, 3)), hidden_size=draw(st.integers(2, 4)),
              num_layers=draw(st.integers(1, 2)), bias=draw(st.booleans()), batch_first=draw(st.booleans()),
              bidirectional=draw(st.booleans()))
    if draw(st.booleans()):
        kw["proj_size"] = draw(st.integers(1, kw["hidden_size"] - 1))
    T, B = draw(st.integers(1, 3)), draw(st.integers(0, 2))
    batched = draw(st.booleans())
    I = kw["input_size"] + draw(st.sampled_from([0, 0, 0, 1, -1]))
    shape = ([B, T, I] if kw["batch_first"] else [T, B, I]) if batched else [T, I]
    D, P = 2 if kw["bidirectional"] else 1, kw.get("proj_size") or kw["hidden_size"]
    hx = None
    if draw(st.booleans()):
        hs = [[kw["num_layers"] * D, B, P], [kw["num_layers"] * D, B, kw["hidden_size"]]]
        if not batched:
            hs = [[s[0], s[2]] for s in hs]
        which = draw(st.sampled_from([None, None, 0, 1]))
        if which is not None:
            hs[which][-1] += 1
        hx = [_tensor(s, torch.float32, draw(st.booleans())) for s in hs]
    x = _tensor(shape, torch.float32, draw(st.booleans()))
    if draw(st.integers(0, 5)) == 0:
        x = x.double()  # a dtype the module's parameters are not in
    return kw, x, hx


@FUZZ
@given(module_case())
def test_module_matches_nn_lstm_or_raises_where_it_does(case):
    kw, x, hx = case
    torch.manual_seed(0)
    ref, ours = nn.LSTM(**kw), pipelstm.LSTM(**kw)
    ours.load_state_dict(ref.state_dict())
    state = None if hx is None else tuple(hx)
    try:
        expected = ref(x, state)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        event("refused")
        with pytest.raises(type(e)) as got:  # the same type (tests/nn_lstm_rejections.py: the rule)
            ours(x, state)
        assert type(got.value) is type(e), (got.value, e)
        return
    out, (h, c) = ours(x, state)
    for g, e in ((out, expected[0]), (h, expected[1][0]), (c, expected[1][1])):
        assert g.shape == e.shape and _error(g, e) <= 1e-4
