"""Runs pipelstm.LSTM (float32, CPU) against nn.LSTM in float64 over shapes
that reach every corner of the fused step kernels, in this process's
PIPELSTM_CPU_ISA, and prints one JSON line: the ISA in use and each case's
relative error over outputs, final states and every gradient.

Shapes: hidden sizes that are not a multiple of any vector width (panel
tails), batches that are not a multiple of any register tile (row tails),
more than one row chunk (96+ rows), depths past the K-blocking threshold
(4H > 512, P > 512) and panels past the size up to which they are not
sliced at all (4H = 4160: 1.04 MiB on avx512), packed sequences,
projections, both directions, given (h0, c0) and 1 or 2 threads.

Then non-finite values: NaN, +-inf and huge values placed in the input and
the initial state, NaN and inf in each weight with no hx given (dense and
packed, with and without projection), and saturated gates (w_hh scaled by 1e30). Every output
and gradient must be NaN / inf exactly where nn.LSTM's (float64) is, and
the saturated case's input gradient as nn.LSTM's.

And the activations themselves, element by element (activation_error),
and the kernels' GEMM on page-strided transposed a's (gemm_error).
"""

import json
import os
import sys

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import pipelstm

CASES = [
    # T, B, I, H, layers, bidirectional, proj_size, packed, hx, threads
    (5, 3, 7, 5, 1, False, 0, False, False, 1),
    (9, 1, 13, 37, 1, False, 0, False, True, 1),
    (6, 7, 20, 19, 2, True, 0, False, True, 2),
    (4, 4, 10, 12, 1, False, 5, False, True, 1),
    (7, 5, 9, 17, 2, True, 6, True, True, 2),
    (10, 11, 16, 33, 1, False, 0, True, False, 1),
    (3, 101, 24, 40, 1, False, 0, True, True, 2),
    (3, 5, 16, 150, 1, True, 0, False, True, 1),
    (3, 4, 600, 530, 1, False, 0, False, True, 2),
    (3, 3, 40, 600, 1, False, 520, False, True, 1),
    (2, 101, 8, 1040, 1, False, 0, False, True, 1),
]


def run_case(T, B, I, H, layers, bidirectional, proj, packed, hx, threads):
    torch.set_num_threads(threads)
    ref = nn.LSTM(I, H, layers, bidirectional=bidirectional, proj_size=proj).double()
    ours = pipelstm.LSTM(I, H, layers, bidirectional=bidirectional, proj_size=proj)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    D, P = (2 if bidirectional else 1), (proj or H)
    x = torch.randn(T, B, I, dtype=torch.double)
    state = (torch.randn(layers * D, B, P, dtype=torch.double),
             torch.randn(layers * D, B, H, dtype=torch.double)) if hx else None
    if packed:
        lengths = torch.randint(1, T + 1, (B,))
        lengths[0] = T
        xa = pack_padded_sequence(x, lengths, enforce_sorted=False)
        xb = pack_padded_sequence(x.float(), lengths, enforce_sorted=False)
        xa.data.requires_grad_()
        xb.data.requires_grad_()
        leaves = (xa.data, xb.data)
    else:
        xa, xb = x.clone().requires_grad_(), x.float().requires_grad_()
        leaves = (xa, xb)
    out_a, (h_a, c_a) = ref(xa, state)
    out_b, (h_b, c_b) = ours(xb, None if state is None else tuple(s.float() for s in state))
    out_a, out_b = (out_a.data, out_b.data) if packed else (out_a, out_b)
    w_out, w_h, w_c = torch.randn_like(out_a), torch.randn_like(h_a), torch.randn_like(c_a)
    ((out_a * w_out).sum() + (h_a * w_h).sum() + (c_a * w_c).sum()).backward()
    ((out_b * w_out.float()).sum() + (h_b * w_h.float()).sum() + (c_b * w_c.float()).sum()).backward()
    pairs = [(out_b, out_a), (h_b, h_a), (c_b, c_a), (leaves[1].grad, leaves[0].grad)]
    pairs += [(pb.grad, pa.grad) for pa, pb in zip(ref.parameters(), ours.parameters())]
    err = 0.0
    for got, want in pairs:
        scale = want.abs().max().item() or 1.0
        err = max(err, (got.double() - want).abs().max().item() / scale)
    return err


NON_FINITE = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30]


def _outputs_and_grads(model, x, h0, c0, dtype):
    leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (x, h0, c0)]
    out, (h, c) = model(leaves[0], tuple(leaves[1:]))
    (out.sum() + h.sum() + c.sum()).backward()
    got = [out, h, c, *(t.grad for t in leaves), *(p.grad for p in model.parameters())]
    model.zero_grad()
    return got


def non_finite_mismatches(H: int) -> list:
    """The (value, where) placements whose NaN / inf pattern differs from nn.LSTM's."""
    torch.manual_seed(H)
    ref = nn.LSTM(3, H).double()
    ours = pipelstm.LSTM(3, H)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    bad = []
    for value in NON_FINITE:
        for where in ("x", "h0", "c0"):
            x, h0, c0 = torch.randn(4, 3, 3), torch.randn(1, 3, H), torch.randn(1, 3, H)
            {"x": x[1, 0], "h0": h0[0, 1], "c0": c0[0, 2]}[where][-1] = value
            for a, b in zip(_outputs_and_grads(ours, x, h0, c0, torch.float32),
                            _outputs_and_grads(ref, x, h0, c0, torch.float64)):
                if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())):
                    bad.append([value, where])
                    break
    return bad


def _weight_outputs_and_grads(model, x):
    x = x.detach().clone().requires_grad_() if not isinstance(x, PackedSequence) else x
    out, (h, c) = model(x)  # no hx: every row starts from a zero h0
    data = out.data if isinstance(out, PackedSequence) else out
    (data.sum() + h.sum() + c.sum()).backward()
    got = [data, h, c, *(p.grad for p in model.parameters())]
    model.zero_grad()
    return got


def weight_non_finite_mismatches(H: int) -> list:
    """The (value, weight, packed, proj) cases, a NaN or inf in one weight and
    no hx given, whose NaN / inf pattern differs from nn.LSTM's: a zero h0
    times a non-finite w_hh is NaN, so the first step's recurrent product
    cannot be skipped then."""
    bad = []
    for proj in ((0, 2) if H > 2 else (0,)):
        for packed in (False, True):
            torch.manual_seed(H + proj)
            ref = nn.LSTM(3, H, proj_size=proj).double()
            ours = pipelstm.LSTM(3, H, proj_size=proj)
            for value in (float("nan"), float("inf")):
                for weight in ("weight_hh_l0", "weight_ih_l0", "bias_hh_l0") + (("weight_hr_l0",) if proj else ()):
                    state = {k: v.clone() for k, v in ref.state_dict().items()}
                    state[weight].view(-1)[1] = value
                    ref.load_state_dict(state)
                    ours.load_state_dict({k: v.float() for k, v in state.items()})
                    x = torch.randn(4, 3, 3, dtype=torch.float64)
                    x64, x32 = (pack_padded_sequence(x, [4, 3, 2]), pack_padded_sequence(x.float(), [4, 3, 2])) \
                        if packed else (x, x.float())
                    for a, b in zip(_weight_outputs_and_grads(ours, x32), _weight_outputs_and_grads(ref, x64)):
                        if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())):
                            bad.append([value, weight, packed, proj])
                            break
    return bad


def saturated_gradient_error() -> float:
    torch.manual_seed(1)
    ref = nn.LSTM(4, 20).double()
    with torch.no_grad():
        ref.weight_hh_l0.mul_(1e30)
    ours = pipelstm.LSTM(4, 20)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(6, 2, 4, dtype=torch.double)
    grads = []
    for model, dtype in ((ours, torch.float32), (ref, torch.float64)):
        xx = x.to(dtype).requires_grad_()
        out, (h, _) = model(xx)
        (out.sum() + h.sum()).backward()
        grads.append(xx.grad.double())
    return ((grads[0] - grads[1]).abs().max() / grads[1].abs().max()).item()


def activation_error(H: int = 37, B: int = 4096) -> float:
    """The cell's activations element by element: one step from a zero state
    with w_ih the identity and no w_hh or bias, so the pre-activations are
    the input itself, against float64 math on the same float32 input. The
    largest relative error of c = sigmoid(i) tanh(g) and of h = sigmoid(o)
    tanh(c): a few ulp unless an activation is a cruder approximation (the
    whole-model cases above allow 2e-5)."""
    torch.manual_seed(2)
    ours = pipelstm.LSTM(4 * H, H, bias=False)
    with torch.no_grad():
        ours.weight_ih_l0.copy_(torch.eye(4 * H))
        ours.weight_hh_l0.zero_()
    # Magnitudes from 1e-8 to 12, both signs: tanh near 0, the curve, saturation.
    x = torch.where(torch.rand(B, 4 * H) < 0.5, 10 ** (torch.rand(B, 4 * H) * 8 - 8),
                    torch.rand(B, 4 * H) * 12)
    x = (x * torch.randn(B, 4 * H).sign()).float()
    with torch.no_grad():
        _, (h, c) = ours(x[None])
    i, f, g, o = x.double().chunk(4, dim=1)
    c_ref = torch.sigmoid(i) * torch.tanh(g)
    h_ref = torch.sigmoid(o) * torch.tanh(c_ref)
    err = 0.0
    for got, want in ((c[0], c_ref), (h[0], h_ref)):
        keep = want.abs() > 1e-30
        err = max(err, ((got.double() - want).abs()[keep] / want.abs()[keep]).max().item())
    return err


def gemm_error() -> float:
    """The kernels' GEMM (PIPELSTM_CPU_GEMM=own) on a's that are transposed
    views whose row stride is a multiple of 4 KiB (a weight gradient's
    grad_gates.t() at H = 256: the avx2 build copies their slices first),
    against float64: the largest relative error over 1 and 2 threads,
    out = a @ b and out += a @ b. Depth 300 = 128 + 128 + 44 (slices),
    1000-1024 rows (chunks and a tail), 200 columns (panels and a tail)."""
    os.environ["PIPELSTM_CPU_GEMM"] = "own"  # read on each call
    g = torch.Generator().manual_seed(3)
    err = 0.0
    for M, stride in ((1024, 1024), (1000, 2048), (5, 1024)):
        a = torch.randn(300, stride, generator=g)[:, :M].t()
        b = torch.randn(300, 200, generator=g)
        start = torch.randn(M, 200, generator=g)
        want = a.double() @ b.double()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for accumulate in (False, True):
                out = start.clone() if accumulate else torch.full((M, 200), float("nan"))
                pipelstm._C._layer_mm_out(out, a, b, accumulate=accumulate)
                ref = want + start.double() if accumulate else want
                err = max(err, ((out.double() - ref).abs().max() / ref.abs().max()).item())
    del os.environ["PIPELSTM_CPU_GEMM"]
    return err


def main() -> None:
    torch.manual_seed(0)
    results = [dict(case=list(c), rel_error=run_case(*c)) for c in CASES]
    non_finite = [m for H in (1, 19, 40) for m in non_finite_mismatches(H)]
    weight_non_finite = [m for H in (1, 19, 40) for m in weight_non_finite_mismatches(H)]
    json.dump(dict(isa=pipelstm._C.cpu_isa(), results=results, non_finite_mismatches=non_finite,
                   weight_non_finite_mismatches=weight_non_finite,
                   saturated_rel_error=saturated_gradient_error(),
                   activation_rel_error=activation_error(), gemm_rel_error=gemm_error()),
              sys.stdout)
    print()


if __name__ == "__main__":
    main()
