"""The forward calls nn.LSTM and nn.LSTMCell reject, shared by the tests of
every module that must reject them the same way (pipelstm.LSTM, LSTMCell,
LSTM(devices=)).

``FORWARD_CASES``: a few named calls with the message each must give.
``bad_calls()``: the differential check's generator, every kind of bad
input (dims, dtypes, devices, hx shapes, types and lengths, unbatched vs
batched hx, proj_size, PackedSequence data and batch_sizes, LSTMCell's
equivalents) for every module configuration; ``compare`` runs one call on
both sides. The rule: wherever torch raises, pipelstm raises the same
exception type, except in the cases of ``ACCIDENTAL`` (torch fails there
by accident, from indexing a malformed value; pipelstm raises the type of
torch's deliberate check of the same fault). ``STRICTER`` lists the cases
where pipelstm refuses what torch computes, with the reason.
"""

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Type

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pack_sequence

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
    "hx a tensor": (KW, lambda: (zeros(T, B, 3), zeros(2, B, 4)), r"expected hx to be a tuple \(h_0, c_0\) of two tensors, got Tensor"),
    "input dtype": (KW, lambda: (zeros(T, B, 3, dtype=torch.float64),), r"input dtype \(torch.float64\) does not match weight dtype"),
    "proj hx size": (dict(KW, proj_size=2), lambda: (zeros(T, B, 3), (zeros(2, B, 4), zeros(2, B, 4))), r"Expected hidden\[0\] size \(2, 2, 2\)"),
}


def assert_rejects_like_nn_lstm(case, make_ours):
    """FORWARD_CASES[case] fails in `make_ours(**kw)` as in nn.LSTM: the same
    exception type (ACCIDENTAL's where torch fails by accident), a message
    matching the case's pattern."""
    kw, make_args, pattern = FORWARD_CASES[case]
    with pytest.raises(Exception) as ref_error:
        nn.LSTM(**kw)(*make_args())
    expected = ACCIDENTAL[case][0] if case in ACCIDENTAL else ref_error.type
    with pytest.raises(expected, match=pattern):
        make_ours(**kw)(*make_args())


# --- the differential check ---------------------------------------------------------

# Cases where torch raises by accident, not from a check of its own: case ->
# (the type pipelstm raises, why). hx that is not a tuple of two tensors
# fails in nn.LSTM's Python code as it indexes it (IndexError, or a
# RuntimeError about the dims of a slice of it) or calls .dim() on an item
# (AttributeError); where torch checks it on purpose (its C++ bindings, a
# PackedSequence's hx, nn.LSTMCell) it is a TypeError, and a tuple of another
# length a RuntimeError ("expects two hidden states").
_HX_TYPE = "hx is not a tuple or list: TypeError, the type torch's bindings raise for it on purpose"
_HX_ITEM = "an item of hx is not a tensor: TypeError (torch: AttributeError from calling .dim() on it)"
_HX_LEN = ("hx of another length than 2: RuntimeError, nn.LSTM's deliberate 'lstm expects two hidden states' "
           "(torch: IndexError from hx[1] for fewer than 2)")
ACCIDENTAL: Dict[str, Tuple[Type[BaseException], str]] = {
    "hx a tensor": (TypeError, _HX_TYPE),
    "hx a str": (TypeError, _HX_TYPE),
    "hx a dict": (TypeError, _HX_TYPE),
    "hx of 1": (RuntimeError, _HX_LEN),
    "hx empty": (RuntimeError, _HX_LEN),
    "hx (None, c)": (TypeError, _HX_ITEM),
    "hx (h, None)": (TypeError, _HX_ITEM),
    "hx (h, list)": (TypeError, _HX_ITEM),
    "packed batch_sizes float": (RuntimeError, "torch's kernel refuses it with a RuntimeError; without hx, "
                                               "nn.LSTM first fails making the zero state (TypeError)"),
    "packed batch_sizes 2-D": (RuntimeError, "as packed batch_sizes float"),
    "cell hx a str": (TypeError, _HX_TYPE),
    "cell hx (None, c)": (TypeError, _HX_ITEM),
    "cell hx (h, list)": (TypeError, _HX_ITEM),
    "packed hx 2-D": (RuntimeError, "the padded input's deliberate 'hx and cx should also be 3-D' (torch's "
                                    "kernel: IndexError, a dimension out of range)"),
}

# Where pipelstm refuses what torch computes: case -> reason.
STRICTER: Dict[str, str] = {
    "packed batch_sizes with a zero": "a batch size of 0 ends the sequences: pack_padded_sequence never makes "
                                      "one, and torch runs empty steps",
    "packed data with rows past batch_sizes": "the data has more rows than the batch sizes add up to; torch "
                                              "ignores the rest",
    "packed batch_sizes 2-D, hx": "batch_sizes must be 1-D; with proj_size torch's kernel reads it flattened",
    "packed one sequence, input_size": "a feature size other than input_size: torch checks it only for a batch of "
                                       "two or more sequences",
    "cell c float64": "h and c of different dtypes: torch promotes the state to float64 silently",
    "cell hx on meta": "h and c on another device than the input (meta): torch without bias returns meta "
                       "tensors",
}


@dataclass(frozen=True)
class Call:
    """One forward call: ``module`` (``"LSTM"`` or ``"LSTMCell"``) built
    with ``kw``, called with ``make_args()``."""

    case: str
    config: str
    module: str
    kw: dict
    make_args: Callable[[], tuple]

    @property
    def id(self) -> str:
        return f"{self.config} {self.case}"


def _lstm_calls(kw: dict) -> Dict[str, Callable[[], tuple]]:
    L = kw["num_layers"] * (2 if kw["bidirectional"] else 1)
    P, bf = kw["proj_size"] or 4, kw["batch_first"]
    x = lambda I=3, dtype=torch.float32: zeros(*((B, T) if bf else (T, B)), I, dtype=dtype)  # noqa: E731
    hx = lambda: (zeros(L, B, P), zeros(L, B, 4))  # noqa: E731

    def packed(data=None, batch_sizes=None, indices=None):
        ps = pack_padded_sequence(x(), torch.tensor([T, 3]), batch_first=bf)
        return PackedSequence(ps.data if data is None else data(ps.data),
                              ps.batch_sizes if batch_sizes is None else batch_sizes(ps.batch_sizes),
                              *(indices or ()))

    return {
        "0-D input": lambda: (torch.tensor(1.0),),
        "1-D input": lambda: (zeros(3),),
        "4-D input": lambda: (zeros(T, B, 3, 1),),
        "input not a tensor": lambda: ([[1.0]],),
        "input None": lambda: (None,),
        "input_size": lambda: (x(5),),
        "input_size unbatched": lambda: (zeros(T, 5),),
        "input float64": lambda: (x(dtype=torch.float64),),
        "input int64": lambda: (x(dtype=torch.int64),),
        "input float16": lambda: (x(dtype=torch.float16),),
        "input bfloat16": lambda: (x(dtype=torch.bfloat16),),
        "input complex": lambda: (x(dtype=torch.complex64),),
        "input on meta": lambda: (x().to("meta"),),
        "no time steps": lambda: (zeros(*((B, 0) if bf else (0, B)), 3),),
        "hx a list": lambda: (x(), list(hx())),
        "hx a tensor": lambda: (x(), hx()[0]),
        "hx a str": lambda: (x(), "hx"),
        "hx a dict": lambda: (x(), {0: hx()[0]}),
        "hx of 1": lambda: (x(), hx()[:1]),
        "hx of 3": lambda: (x(), (*hx(), hx()[0])),
        "hx empty": lambda: (x(), ()),
        "hx (None, c)": lambda: (x(), (None, hx()[1])),
        "hx (h, None)": lambda: (x(), (hx()[0], None)),
        "hx (h, list)": lambda: (x(), (hx()[0], hx()[1].tolist())),
        "h layers": lambda: (x(), (zeros(L + 1, B, P), zeros(L, B, 4))),
        "c layers": lambda: (x(), (zeros(L, B, P), zeros(L + 1, B, 4))),
        "h batch": lambda: (x(), (zeros(L, B + 1, P), zeros(L, B, 4))),
        "c batch": lambda: (x(), (zeros(L, B, P), zeros(L, B + 1, 4))),
        "h size": lambda: (x(), (zeros(L, B, P + 1), zeros(L, B, 4))),
        "c size": lambda: (x(), (zeros(L, B, P), zeros(L, B, 5))),
        "h of hidden_size (proj_size)": lambda: (x(), (zeros(L, B, 4), zeros(L, B, 4))),
        "c of proj_size": lambda: (x(), (zeros(L, B, P), zeros(L, B, P))),
        "2-D hx for batched input": lambda: (x(), (zeros(L, P), zeros(L, 4))),
        "3-D hx for unbatched input": lambda: (zeros(T, 3), (zeros(L, 1, P), zeros(L, 1, 4))),
        "2-D h, 3-D c": lambda: (x(), (zeros(L, P), zeros(L, B, 4))),
        "3-D h, 2-D c": lambda: (x(), (zeros(L, B, P), zeros(L, 4))),
        "4-D hx": lambda: (x(), (zeros(L, B, P, 1), zeros(L, B, 4, 1))),
        "1-D hx for unbatched input": lambda: (zeros(T, 3), (zeros(P), zeros(4))),
        "unbatched h layers": lambda: (zeros(T, 3), (zeros(L + 1, P), zeros(L, 4))),
        "unbatched c size": lambda: (zeros(T, 3), (zeros(L, P), zeros(L, 5))),
        "hx float64": lambda: (x(), tuple(t.double() for t in hx())),
        "h float64": lambda: (x(), (hx()[0].double(), hx()[1])),
        "c float64": lambda: (x(), (hx()[0], hx()[1].double())),
        "hx int64": lambda: (x(), tuple(t.long() for t in hx())),
        "hx on meta": lambda: (x(), tuple(t.to("meta") for t in hx())),
        "c on meta": lambda: (x(), (hx()[0], hx()[1].to("meta"))),
        "packed data float64": lambda: (packed(data=lambda d: d.double()),),
        "packed data int64": lambda: (packed(data=lambda d: d.long()),),
        "packed data on meta": lambda: (packed(data=lambda d: d.to("meta")),),
        "packed data 3-D": lambda: (packed(data=lambda d: d.unsqueeze(1)),),
        "packed data 1-D": lambda: (packed(data=lambda d: d[:, 0]),),
        "packed input_size": lambda: (packed(data=lambda d: zeros(d.shape[0], 5)),),
        "packed one sequence, input_size": lambda: (pack_sequence([zeros(T, 5)]),),
        "packed batch_sizes float": lambda: (packed(batch_sizes=lambda b: b.float()),),
        "packed batch_sizes float, hx": lambda: (packed(batch_sizes=lambda b: b.float()), hx()),
        "packed batch_sizes int32": lambda: (packed(batch_sizes=lambda b: b.int()),),
        "packed batch_sizes 2-D": lambda: (packed(batch_sizes=lambda b: b[None]),),
        "packed batch_sizes 2-D, hx": lambda: (packed(batch_sizes=lambda b: b[None]), hx()),
        "packed batch_sizes empty": lambda: (PackedSequence(zeros(0, 3), torch.zeros(0, dtype=torch.long)),),
        "packed batch_sizes increasing": lambda: (packed(batch_sizes=lambda b: b.flip(0)),),
        "packed batch_sizes with a zero": lambda: (packed(batch_sizes=lambda b: torch.tensor([2, 2, 2, 1, 1, 0])),),
        "packed batch_sizes negative": lambda: (packed(batch_sizes=lambda b: torch.tensor([2, 2, 2, 1, 2, -1])),),
        "packed batch_sizes past the data": lambda: (packed(batch_sizes=lambda b: torch.tensor([2] * 5)),),
        "packed data with rows past batch_sizes": lambda: (packed(batch_sizes=lambda b: torch.tensor([2, 2, 1, 1, 1])),),
        "packed batch_sizes on meta": lambda: (packed(batch_sizes=lambda b: b.to("meta")),),
        "packed hx batch": lambda: (packed(), (zeros(L, B + 1, P), zeros(L, B + 1, 4))),
        "packed hx 2-D": lambda: (packed(), (zeros(L, P), zeros(L, 4))),
        "packed hx float64": lambda: (packed(), tuple(t.double() for t in hx())),
        "packed hx a tensor": lambda: (packed(), hx()[0]),
        "packed hx of 3": lambda: (packed(), (*hx(), hx()[0])),
        "packed sorted_indices short": lambda: (packed(indices=(torch.tensor([0]), torch.tensor([0]))), hx()),
        "packed sorted_indices float": lambda: (packed(indices=(torch.tensor([1.0, 0.0]),) * 2), hx()),
        "valid: hx given": lambda: (x(), hx()),
        "valid: packed with hx": lambda: (packed(), hx()),
        "valid: empty batch": lambda: (zeros(*((0, T) if bf else (T, 0)), 3),),
    }


def _cell_calls() -> Dict[str, Callable[[], tuple]]:
    h = lambda: zeros(B, 4)  # noqa: E731
    x = lambda: zeros(B, 3)  # noqa: E731
    return {
        "cell 0-D input": lambda: (torch.tensor(1.0),),
        "cell 3-D input": lambda: (zeros(B, 3, 1),),
        "cell input not a tensor": lambda: ([1.0, 2.0, 3.0],),
        "cell input_size": lambda: (zeros(B, 5),),
        "cell input_size unbatched": lambda: (zeros(5),),
        "cell input float64": lambda: (x().double(),),
        "cell input int64": lambda: (x().long(),),
        "cell input float16": lambda: (x().half(),),
        "cell input on meta": lambda: (x().to("meta"),),
        "cell hx a tensor": lambda: (x(), h()),
        "cell hx a str": lambda: (x(), "ab"),
        "cell hx of 1": lambda: (x(), (h(),)),
        "cell hx of 3": lambda: (x(), (h(),) * 3),
        "cell hx (None, c)": lambda: (x(), (None, h())),
        "cell hx (h, list)": lambda: (x(), (h(), [1.0])),
        "cell 3-D hx": lambda: (x(), (zeros(1, B, 4), zeros(1, B, 4))),
        "cell 0-D hx": lambda: (x(), (torch.tensor(0.0), torch.tensor(0.0))),
        "cell 1-D hx for batched input": lambda: (x(), (zeros(4), zeros(4))),
        "cell 2-D hx for unbatched input": lambda: (zeros(3), (zeros(1, 4), zeros(1, 4))),
        "cell 1-D h, 2-D c": lambda: (x(), (zeros(4), h())),
        "cell hx batch": lambda: (x(), (zeros(B + 1, 4), zeros(B + 1, 4))),
        "cell c batch": lambda: (x(), (h(), zeros(B + 1, 4))),
        "cell h size": lambda: (x(), (zeros(B, 5), h())),
        "cell c size": lambda: (x(), (h(), zeros(B, 5))),
        "cell hx float64": lambda: (x(), (h().double(), h().double())),
        "cell h float64": lambda: (x(), (h().double(), h())),
        "cell c float64": lambda: (x(), (h(), h().double())),
        "cell hx int64": lambda: (x(), (h().long(), h().long())),
        "cell hx on meta": lambda: (x(), (h().to("meta"), h().to("meta"))),
        "cell c on meta": lambda: (x(), (h(), h().to("meta"))),
        "cell valid: hx a list": lambda: (x(), [h(), h()]),
        "cell valid: empty batch": lambda: (zeros(0, 3),),
    }


def bad_calls() -> List[Call]:
    """Every case for every configuration (deterministic): 16 of LSTM, 2 of LSTMCell."""
    calls = []
    for layers, bi, proj, bf in itertools.product((1, 2), (False, True), (0, 2), (False, True)):
        kw = dict(input_size=3, hidden_size=4, num_layers=layers, bidirectional=bi, proj_size=proj, batch_first=bf)
        config = f"LSTM(layers={layers}{', bidirectional' if bi else ''}{', proj_size=2' if proj else ''}" \
                 f"{', batch_first' if bf else ''})"
        calls += [Call(case, config, "LSTM", kw, args) for case, args in _lstm_calls(kw).items()]
    for bias in (True, False):
        kw = dict(input_size=3, hidden_size=4, bias=bias)
        calls += [Call(case, f"LSTMCell(bias={bias})", "LSTMCell", kw, args) for case, args in _cell_calls().items()]
    return calls


def outcome(fn: Callable[[], object]) -> Optional[BaseException]:
    """The exception ``fn()`` raises, or None."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (any exception is an outcome to compare)
        return e
    return None


def compare(call: Call, ours_of: Dict[str, Callable[..., nn.Module]]) -> Optional[str]:
    """Runs ``call`` on torch's module and on ``ours_of[call.module](**call.kw)``
    (same weights). Returns what differs against the rule, or None."""
    ref_module = getattr(nn, call.module)(**call.kw)
    ours = ours_of[call.module](**call.kw)
    ours.load_state_dict(ref_module.state_dict())
    ref = outcome(lambda: ref_module(*call.make_args()))
    got = outcome(lambda: ours(*call.make_args()))
    if ref is None and got is None:
        return None
    if ref is None:
        if call.case in STRICTER and isinstance(got, RuntimeError):
            return None
        return f"{call.id}: torch computes, pipelstm raises {type(got).__name__}: {got}"
    expected = ACCIDENTAL[call.case][0] if call.case in ACCIDENTAL else type(ref)
    if got is None:
        return f"{call.id}: torch raises {type(ref).__name__} ({ref}), pipelstm computes"
    if type(got) is not expected:
        return (f"{call.id}: expected {expected.__name__} (torch: {type(ref).__name__}: {ref}), "
                f"pipelstm raised {type(got).__name__}: {got}")
    return None
