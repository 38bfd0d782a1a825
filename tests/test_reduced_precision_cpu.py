"""bfloat16 and float16 on the CPU: the ops themselves take them and compute
in float32 (csrc/float32_upcast.h, csrc/cpu/lstm_layer_cpu.cpp).

Every result and every gradient equals a float32 call on float32 copies of
the tensors, rounded to the dtype (autograd through the casts: what a
Python-side upcast gives), and is within one unit in the last place of the
float64 result rounded the same way.
"""

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence
from torch.utils._python_dispatch import TorchDispatchMode

import pipelstm  # noqa: F401
from pipelstm.ops import lstm_cell, lstm_layer, lstm_packed_layer
from reference import cell as reference_cell
from reference import layer as reference_layer
from reference import packed_layer as reference_packed_layer

ops = torch.ops.pipelstm
REDUCED = [torch.bfloat16, torch.float16]
T, B, I, H = 5, 3, 4, 6


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values of their (16-bit) dtype lie between a and b."""
    assert a.dtype == b.dtype and a.element_size() == 2

    def ordered(t):
        i = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -32768 - i, i)

    return (ordered(a) - ordered(b)).abs()


def _layer_tensors(dtype, P, bias, packed):
    g = torch.Generator().manual_seed(0)

    def rnd(*s, scale=0.5):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)

    out = P or H
    if packed:
        x = pack_sequence([rnd(n, I, scale=1.0) for n in (T, T - 2, 2)])
        inputs, batch_sizes = x.data, x.batch_sizes
    else:
        inputs, batch_sizes = rnd(T, B, I, scale=1.0), None
    tensors = dict(
        input=inputs, h0=rnd(B, out), c0=rnd(B, H), w_ih=rnd(4 * H, I), w_hh=rnd(4 * H, out),
        b_ih=rnd(4 * H) if bias else None, b_hh=rnd(4 * H) if bias else None, w_hr=rnd(out, H) if P else None,
    )
    return tensors, batch_sizes


def _run(tensors, batch_sizes, reverse, cast=None, reference=False):
    """(results, gradients of every tensor) of one layer call from leaves
    ``tensors``; ``cast`` casts each leaf before the call (autograd through
    the casts); ``reference`` calls tests/reference.py instead of the op."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items() if v is not None}
    args = {k: (leaves[k].to(cast) if cast else leaves[k]) if k in leaves else None for k in tensors}
    x, h0, c0 = args.pop("input"), args.pop("h0"), args.pop("c0")
    if batch_sizes is None:
        results = (reference_layer if reference else lstm_layer)(x, h0, c0, **args, reverse=reverse)
    elif reference:
        results = reference_packed_layer(x, batch_sizes.tolist(), h0, c0, reverse=reverse, **args)
    else:
        results = lstm_packed_layer(x, batch_sizes, h0, c0, **args, reverse=reverse)
    dtype = next(iter(leaves.values())).dtype
    results = tuple(r.to(dtype) for r in results)
    g = torch.Generator().manual_seed(1)
    grads_out = [torch.randn(r.shape, generator=g, dtype=torch.float64).to(dtype) for r in results]
    torch.autograd.backward(results, grads_out)
    return results, {k: v.grad for k, v in leaves.items()}


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("P, bias, reverse", [(0, True, False), (0, False, True), (2, True, True)])
def test_layer_equals_the_float32_call_rounded(dtype, packed, P, bias, reverse):
    tensors, batch_sizes = _layer_tensors(dtype, P, bias, packed)
    got, got_grads = _run(tensors, batch_sizes, reverse)
    upcast, upcast_grads = _run(tensors, batch_sizes, reverse, cast=torch.float32)
    exact, exact_grads = _run(tensors, batch_sizes, reverse, cast=torch.float64, reference=True)
    assert all(r.dtype == dtype for r in got) and all(g.dtype == dtype for g in got_grads.values())
    for name, a, b, c in [(f"result {i}", got[i], upcast[i], exact[i]) for i in range(3)] + [
        (f"grad {k}", got_grads[k], upcast_grads[k], exact_grads[k]) for k in got_grads
    ]:
        assert torch.equal(a, b), name
        assert _ulps(a, c).max() <= 1, name


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("bias", [False, True])
def test_cell_equals_the_float32_call_rounded(dtype, bias):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "input_gates": torch.randn(B, 4 * H, generator=g, dtype=torch.float64),
        "hidden_gates": torch.randn(B, 4 * H, generator=g, dtype=torch.float64),
        "cx": torch.randn(B, H, generator=g, dtype=torch.float64),
    }
    if bias:
        tensors.update(b_ih=torch.randn(4 * H, generator=g, dtype=torch.float64) * 0.1,
                       b_hh=torch.randn(4 * H, generator=g, dtype=torch.float64) * 0.1)
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    grads_out = [torch.randn(B, H, generator=g).to(dtype) for _ in range(2)]

    def run(cast=None, reference=False):
        leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
        a = {k: v.to(cast) if cast else v for k, v in leaves.items()}
        if reference:
            gates = a["input_gates"] + a["hidden_gates"] + sum(a[k] for k in ("b_ih", "b_hh") if k in a)
            hy, cy = reference_cell(gates, a["cx"])
        else:
            hy, cy = lstm_cell(**a)
        hy, cy = hy.to(dtype), cy.to(dtype)
        torch.autograd.backward([hy, cy], grads_out)
        return (hy, cy), {k: v.grad for k, v in leaves.items()}

    got, got_grads = run()
    upcast, upcast_grads = run(torch.float32)
    exact, exact_grads = run(torch.float64, reference=True)
    for i in range(2):
        assert got[i].dtype == dtype and torch.equal(got[i], upcast[i]) and _ulps(got[i], exact[i]).max() <= 1
    for k in got_grads:
        assert got_grads[k].dtype == dtype and torch.equal(got_grads[k], upcast_grads[k]), k
        assert _ulps(got_grads[k], exact_grads[k]).max() <= 1, k


def test_the_op_itself_takes_bfloat16_tensors():
    tensors, _ = _layer_tensors(torch.bfloat16, 2, True, packed=False)
    out, h_n, c_n, workspace = ops.lstm_layer_forward(*tensors.values(), False)
    assert (out.dtype, h_n.dtype, c_n.dtype) == (torch.bfloat16,) * 3
    # float32: the float32 call's workspace, then its float32 output.
    rows = T * B
    assert workspace.dtype == torch.float32 and workspace.shape == (rows * 6 * H + rows * 2,)
    assert torch.equal(workspace[rows * 6 * H:].view(T, B, 2).to(torch.bfloat16), out)
    grads = ops.lstm_layer_backward(torch.ones_like(out), None, None, tensors["input"], tensors["h0"],
                                    tensors["c0"], tensors["w_ih"], tensors["w_hh"], tensors["w_hr"], out,
                                    workspace, False)
    assert all(g.dtype == torch.bfloat16 for g in grads)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_no_cast_before_the_op():
    tensors, _ = _layer_tensors(torch.bfloat16, 0, True, packed=False)
    with _Recorder() as rec:
        lstm_layer(*tensors.values())
    assert rec.ops[0] == "pipelstm.lstm_layer_forward", rec.ops


def test_mixed_dtypes_are_refused_before_any_work():
    tensors, _ = _layer_tensors(torch.bfloat16, 0, True, packed=False)
    tensors["h0"] = tensors["h0"].float()
    with _Recorder() as rec, pytest.raises(RuntimeError, match=r"expected `h0` to have the dtype of `input` "
                                                             r"\(BFloat16\), got Float"):
        lstm_layer(*tensors.values())
    assert rec.ops == ["pipelstm.lstm_layer_forward"]


@pytest.mark.parametrize("dtype", REDUCED)
def test_torch_func_grad_takes_the_float32_composition(dtype):
    # Under torch.func the ops run their ATen composition: in float32 for a
    # reduced-precision CPU call, as the fused op computes it.
    tensors, _ = _layer_tensors(dtype, 2, True, packed=False)
    args = list(tensors.values())

    def loss(w_hh, cast):
        a = [t.to(cast) if cast else t for t in args]
        a[4] = w_hh.to(cast) if cast else w_hh
        out, h_n, c_n = lstm_layer(*a)
        return out.to(dtype).float().square().sum() + h_n.to(dtype).float().sum()

    got = torch.func.grad(loss)(args[4], None)
    expected = torch.func.grad(loss)(args[4], torch.float32)
    assert got.dtype == dtype and torch.equal(got, expected)


def test_meta_tensors_keep_their_dtype():
    tensors, _ = _layer_tensors(torch.bfloat16, 0, True, packed=False)
    meta = [None if t is None else t.to("meta") for t in tensors.values()]
    out, h_n, c_n = lstm_layer(*meta)
    assert out.device.type == "meta" and out.dtype == torch.bfloat16 and out.shape == (T, B, H)
    *_, workspace = ops.lstm_layer_forward(*meta, False)
    assert workspace.dtype == torch.float32 and workspace.shape == (T * B * 6 * H,)


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("packed", [False, True])
def test_opcheck(dtype, packed):
    tensors, batch_sizes = _layer_tensors(dtype, 2, True, packed)
    args = [t.requires_grad_() for t in tensors.values()]
    if packed:
        args.insert(1, batch_sizes)
    forward = ops.lstm_packed_layer_forward if packed else ops.lstm_layer_forward
    torch.library.opcheck(forward, (*args, True))
    out, h_n, c_n, workspace = forward(*args, True)
    backward = ops.lstm_packed_layer_backward if packed else ops.lstm_layer_backward
    grads = (torch.ones_like(out), torch.ones_like(h_n), None)
    del args[-3:-1]  # the biases: the backward takes none
    torch.library.opcheck(backward, (*grads, *[a.detach() for a in args], out.detach(), workspace, True))


@pytest.mark.parametrize("dtype", REDUCED)
def test_cell_opcheck(dtype):
    rnd = lambda *s: torch.randn(*s).to(dtype).requires_grad_()  # noqa: E731
    args = (rnd(B, 4 * H), rnd(B, 4 * H), rnd(B, H), rnd(4 * H), None)
    torch.library.opcheck(ops.lstm_cell_forward, args)
    hy, cy, workspace = ops.lstm_cell_forward(*args)
    assert workspace.dtype == torch.float32 and workspace.shape == (B, 5 * H)
    torch.library.opcheck(ops.lstm_cell_backward, (torch.randn_like(hy), torch.randn_like(cy), args[2].detach(),
                                                  cy.detach(), workspace))
