"""pipelstm.LayerNormLSTM and its fused op, against an independent float64
reference: each sequence on its own, a step at a time, with the
normalisation written out (mean, biased variance, eps) rather than
F.layer_norm."""

import itertools
import math

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import pipelstm
from pipelstm.layernorm_ops import composed_layer, lstm_layernorm_layer
from layernorm_twins import float32_twin

EPS = 1e-5


def _ln(v, gain, shift, eps=EPS):
    centred = v - v.mean(-1, keepdim=True)
    out = centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + eps) * gain
    return out if shift is None else out + shift


def reference_direction(x, h, c, w, keep_c=None, keep_h=None, reverse=False, eps=EPS):
    """One sequence x [L, I] from h, c [H]; w the direction's tensors by name.
    -> (outputs [L, H], h, c)."""
    L = x.shape[0]
    outs = [None] * L
    for t in (range(L - 1, -1, -1) if reverse else range(L)):
        a = _ln(w["w_ih"] @ x[t], w["g_ih"], None, eps) + _ln(w["w_hh"] @ h, w["g_hh"], None, eps)
        if w["bias"] is not None:
            a = a + w["bias"]
        i, f, g, o = a.chunk(4)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(_ln(c_new, w["g_c"], w["b_c"], eps))
        if keep_c is not None:
            c_new = keep_c[t] * c + (1 - keep_c[t]) * c_new
            h_new = keep_h[t] * h + (1 - keep_h[t]) * h_new
        h, c = h_new, c_new
        outs[t] = h
    return torch.stack(outs), h, c


def direction_weights(m, layer, reverse):
    sfx = f"_l{layer}" + ("_reverse" if reverse else "")
    get = lambda name: getattr(m, name + sfx, None)  # noqa: E731
    return {"w_ih": get("weight_ih"), "w_hh": get("weight_hh"),
            "bias": get("bias_ih") + get("bias_hh") if m.bias else None,
            "g_ih": get("layer_norm_ih_weight"), "g_hh": get("layer_norm_hh_weight"),
            "g_c": get("layer_norm_c_weight"), "b_c": get("layer_norm_c_bias")}


def reference_module(m, x, lengths, h0, c0):
    """x [T, B, I] time-major padded; -> (outputs: a [L_b, D*H] per sequence, h_n, c_n)."""
    D = 2 if m.bidirectional else 1
    outputs, h_n, c_n = [], [[None] * x.shape[1] for _ in range(m.num_layers * D)], \
        [[None] * x.shape[1] for _ in range(m.num_layers * D)]
    for b, L in enumerate(lengths):
        seq = x[:L, b]
        for layer in range(m.num_layers):
            outs = []
            for d in range(D):
                k = layer * D + d
                o, h, c = reference_direction(seq, h0[k, b], c0[k, b], direction_weights(m, layer, d == 1), reverse=d == 1)
                outs.append(o)
                h_n[k][b], c_n[k][b] = h, c
            seq = torch.cat(outs, dim=-1)
        outputs.append(seq)
    return outputs, torch.stack([torch.stack(r) for r in h_n]), torch.stack([torch.stack(r) for r in c_n])


def randomised(m, seed=0):
    """m with every parameter random (gains about 1, shifts about 0), so no norm is trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            base = 1.0 if "weight" in name and name.startswith("layer_norm") else 0.0
            p.copy_(base + 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


CASES = list(itertools.product((1, 2), (False, True), (False, True), (False, True), (True, False)))


@pytest.mark.parametrize("layers,bidirectional,packed,batch_first,bias", CASES)
def test_module_matches_the_reference_in_float64(layers, bidirectional, packed, batch_first, bias):
    torch.manual_seed(1)
    T, B, I, H = 5, 3, 4, 6
    m = randomised(pipelstm.LayerNormLSTM(I, H, layers, bias=bias, batch_first=batch_first,
                                          bidirectional=bidirectional, dtype=torch.float64))
    D = 2 if bidirectional else 1
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * D, B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(layers * D, B, H, dtype=torch.float64, requires_grad=True)
    lengths = [5, 2, 4] if packed else [T] * B
    given = x.transpose(0, 1) if batch_first else x
    if packed:
        given = pack_padded_sequence(given, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
    out, (h_n, c_n) = m(given, (h0, c0))
    if packed:
        out, _ = pad_packed_sequence(out, batch_first=batch_first)
    if batch_first:
        out = out.transpose(0, 1)
    ref_out, ref_h, ref_c = reference_module(m, x, lengths, h0, c0)
    for b, L in enumerate(lengths):
        torch.testing.assert_close(out[:L, b], ref_out[b], atol=1e-10, rtol=0)
    torch.testing.assert_close(h_n, ref_h, atol=1e-10, rtol=0)
    torch.testing.assert_close(c_n, ref_c, atol=1e-10, rtol=0)

    # Every gradient, through weights that reach each output in a different mix.
    wo = torch.randn(out.shape[-1], dtype=torch.float64)
    loss = sum((out[:L, b] @ wo).pow(2).sum() for b, L in enumerate(lengths)) + (h_n * 1.5).sum() + (c_n ** 2).sum()
    ref_loss = sum((ref_out[b] @ wo).pow(2).sum() for b in range(B)) + (ref_h * 1.5).sum() + (ref_c ** 2).sum()
    tensors = [x, h0, c0, *m.parameters()]
    for got, want in zip(_grads(loss, tensors), _grads(ref_loss, tensors)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("packed,reverse,fractional", list(itertools.product((False, True), (False, True), (False, True))))
def test_fused_op_under_zoneout_matches_the_reference(packed, reverse, fractional):
    """The op with explicit keep weights (0/1 masks, or evaluation's fractions)."""
    torch.manual_seed(2)
    T, B, I, H = 6, 3, 5, 4
    m = randomised(pipelstm.LayerNormLSTM(I, H, dtype=torch.float64), seed=3)
    w = direction_weights(m, 0, False)
    lengths = [6, 4, 1] if packed else [T] * B
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    keep = [torch.rand(T, B, H, dtype=torch.float64) for _ in range(2)]
    if not fractional:
        keep = [(k < 0.4).double() for k in keep]
    args = (w["w_ih"], w["w_hh"], w["bias"], w["g_ih"], w["g_hh"], w["g_c"], w["b_c"])
    if packed:
        packs = [pack_padded_sequence(t, torch.tensor(lengths)) for t in (x, *keep)]
        out, h_n, c_n = lstm_layernorm_layer(packs[0].data, packs[0].batch_sizes, h0, c0, *args, packs[1].data,
                                             packs[2].data, reverse=reverse)
        out = pad_packed_sequence(torch.nn.utils.rnn.PackedSequence(out, packs[0].batch_sizes))[0]
    else:
        out, h_n, c_n = torch.ops.pipelstm.lstm_layernorm_layer_forward(x, None, h0, c0, *args, *keep, reverse,
                                                                        EPS)[:3]
    refs = [reference_direction(x[:L, b], h0[b], c0[b], w, keep[0][:L, b], keep[1][:L, b], reverse)
            for b, L in enumerate(lengths)]
    for b, L in enumerate(lengths):
        torch.testing.assert_close(out[:L, b], refs[b][0], atol=1e-10, rtol=0)
    torch.testing.assert_close(h_n, torch.stack([r[1] for r in refs]), atol=1e-10, rtol=0)
    torch.testing.assert_close(c_n, torch.stack([r[2] for r in refs]), atol=1e-10, rtol=0)
    loss = sum((out[:L, b] * torch.arange(H)).sum() for b, L in enumerate(lengths)) + h_n.sum() * 2 + c_n.pow(2).sum()
    ref_loss = sum((r[0] * torch.arange(H)).sum() + r[1].sum() * 2 + r[2].pow(2).sum() for r in refs)
    tensors = [x, h0, c0, *m.parameters()]
    for got, want in zip(_grads(loss, tensors), _grads(ref_loss, tensors)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_float32_within_the_references_own_float32_error():
    torch.manual_seed(4)
    m64 = randomised(pipelstm.LayerNormLSTM(16, 32, 2, dtype=torch.float64), seed=5)
    m32 = pipelstm.LayerNormLSTM(16, 32, 2)
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    x = torch.randn(20, 4, 16, dtype=torch.float64)
    want = m64(x)[0]
    got = m32(x.float())[0].double()
    # The reference's own float32 error: the composition in float32.
    with torch.no_grad():
        own = composed_layer(x.float(), None, torch.zeros(4, 32), torch.zeros(4, 32), m32.weight_ih_l0, m32.weight_hh_l0,
                             m32.bias_ih_l0 + m32.bias_hh_l0, *m32._norm_weights(0, False), None, None, False, EPS)[0]
        own_err = (own.double() - m64._direction(x, None, torch.zeros(4, 32, dtype=torch.float64),
                                                 torch.zeros(4, 32, dtype=torch.float64), 0, False)[0]).abs().max()
    assert (got - want).abs().max() <= max(10 * own_err.item(), 1e-5)
    # Packed, with steps of fewer rows than the kernels' GEMM takes (ATen's there).
    packed = pack_padded_sequence(x, torch.tensor([20, 11, 3, 2]))
    want = pad_packed_sequence(m64(packed)[0])[0]
    got = pad_packed_sequence(m32(torch.nn.utils.rnn.PackedSequence(packed.data.float(), packed.batch_sizes))[0])[0]
    assert (got.double() - want).abs().max() <= max(10 * own_err.item(), 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_is_computed_in_float32_and_rounded_once(dtype):
    # A bfloat16/float16 layer op is the float32 op on float32 copies of its
    # tensors (the module's bias_ih + bias_hh among them), its results and
    # gradients rounded to the dtype once, so within twice the dtype's own
    # rounding of the exact result: the composition in the dtype rounds the
    # state at every step and ends at about four times it here.
    torch.manual_seed(6)
    m32 = randomised(pipelstm.LayerNormLSTM(16, 32, bidirectional=True), seed=7)
    m = pipelstm.LayerNormLSTM(16, 32, bidirectional=True, dtype=dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in m32.state_dict().items()})
    m32 = float32_twin(m)
    x = torch.randn(50, 4, 16).to(dtype)
    out, (h, c) = m(x)
    want, (want_h, want_c) = m32(x.float())
    for got, w in ((out, want), (h, want_h), (c, want_c)):
        assert got.dtype == dtype and torch.equal(got, w.to(dtype))
    names = [n for n, _ in m.named_parameters()]
    grads = dict(zip(names, _grads(out.float().square().sum(), list(m.parameters()))))
    want_grads = dict(zip(names, _grads(want.to(dtype).float().square().sum(), list(m32.parameters()))))
    for name in names:
        assert grads[name].dtype == dtype and torch.equal(grads[name], want_grads[name].to(dtype)), name
    m64 = pipelstm.LayerNormLSTM(16, 32, bidirectional=True, dtype=torch.float64)
    m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    exact = m64(x.double())[0]
    rounding = (exact.to(dtype).double() - exact).norm()
    assert (out.double() - exact).norm() <= 2 * rounding


@pytest.mark.parametrize("bidirectional", [False, True])
def test_an_empty_batch_gives_empty_results_as_nn_lstm(bidirectional):
    # nn.LSTM takes a batch of 0 and returns empty outputs and states.
    ref = torch.nn.LSTM(3, 4, 2, bidirectional=bidirectional)
    m = pipelstm.LayerNormLSTM(3, 4, 2, bidirectional=bidirectional, zoneout=(0.1, 0.2))
    x = torch.zeros(5, 0, 3, requires_grad=True)
    want, (want_h, want_c) = ref(x)
    out, (h, c) = m(x)
    assert (out.shape, h.shape, c.shape) == (want.shape, want_h.shape, want_c.shape)
    (out.sum() + h.sum() + c.sum()).backward()
    assert x.grad.shape == x.shape


def test_gradcheck_and_double_backward_of_the_fused_op():
    torch.manual_seed(6)
    T, B, I, H = 3, 2, 3, 2
    m = randomised(pipelstm.LayerNormLSTM(I, H, dtype=torch.float64), seed=7)
    w = direction_weights(m, 0, False)
    tensors = [torch.randn(T, B, I, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64),
               torch.randn(B, H, dtype=torch.float64)] + [w[k].detach() for k in ("w_ih", "w_hh", "bias", "g_ih", "g_hh", "g_c", "b_c")]
    tensors = [t.clone().requires_grad_() for t in tensors]

    def f(x, h0, c0, *rest):
        out, h, c, _ = torch.ops.pipelstm.lstm_layernorm_layer_forward(x, None, h0, c0, *rest, None, None, True, EPS)
        return out, h, c

    assert torch.autograd.gradcheck(f, tensors)
    # The second derivative (the composition's) through the input, a weight and a gain.
    fixed = [t.detach() for t in tensors]

    def g(x, w_hh, g_hh):
        return f(x, *fixed[1:4], w_hh, fixed[5], fixed[6], g_hh, *fixed[8:])

    assert torch.autograd.gradgradcheck(g, [tensors[0], tensors[4], tensors[7]], fast_mode=True)


def test_torch_func_and_forward_mode_run_on_the_composition():
    torch.manual_seed(8)
    m = randomised(pipelstm.LayerNormLSTM(3, 4, dtype=torch.float64), seed=9)
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    params = dict(m.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(m, p, (x,))[0].pow(2).sum())(params)
    want = torch.autograd.grad(m(x)[0].pow(2).sum(), list(params.values()))
    for name, g in zip(params, want):
        torch.testing.assert_close(grads[name], g, atol=1e-10, rtol=0)


def test_compile_fullgraph_matches_eager():
    torch.manual_seed(10)
    m = randomised(pipelstm.LayerNormLSTM(3, 4, 2, bidirectional=True), seed=11)
    x = torch.randn(5, 2, 3)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    got, (h, c) = compiled(x)
    want, (h_w, c_w) = m(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(h, h_w)
    g_got = torch.autograd.grad(compiled(x)[0].sum(), list(m.parameters()))
    g_want = torch.autograd.grad(m(x)[0].sum(), list(m.parameters()))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b)


def test_parameters_initialisation_and_state_dict():
    torch.manual_seed(12)
    m = pipelstm.LayerNormLSTM(3, 4, 2, bidirectional=True)
    names = [n for n, _ in m.named_parameters()]
    torch_names = [n for n, _ in torch.nn.LSTM(3, 4, 2, bidirectional=True).named_parameters()]
    assert names[: len(torch_names)] == torch_names
    assert "layer_norm_hh_weight_l1_reverse" in names and "layer_norm_c_bias_l0" in names
    for name, p in m.named_parameters():
        if name.startswith("layer_norm_c_bias"):
            assert torch.equal(p, torch.zeros_like(p))
        elif name.startswith("layer_norm"):
            assert torch.equal(p, torch.ones_like(p))
        else:
            assert p.abs().max() <= 1 / math.sqrt(4)
    assert "layer_norm_c_bias_l0" not in dict(pipelstm.LayerNormLSTM(3, 4, bias=False).named_parameters())
    other = pipelstm.LayerNormLSTM(3, 4, 2, bidirectional=True)
    other.load_state_dict(randomised(m).state_dict())
    x = torch.randn(2, 1, 3)
    torch.testing.assert_close(other(x)[0], m(x)[0], atol=0, rtol=0)


def test_regularisation_options_apply():
    torch.manual_seed(13)
    x = torch.randn(6, 4, 3)
    for options in ({"weight_dropout": 0.5}, {"dropout": 0.5, "dropout_mode": "variational"}, {"zoneout": (0.3, 0.2)}):
        m = pipelstm.LayerNormLSTM(3, 5, 2, **options)
        m.eval()
        first, second = m(x)[0], m(x)[0]
        torch.testing.assert_close(first, second, atol=0, rtol=0)  # evaluation is deterministic
        m.train()
        torch.manual_seed(14)
        a = m(x)[0]
        torch.manual_seed(14)
        b = m(x)[0]
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # the same seed, the same run
        assert not torch.allclose(a, m(x)[0])  # another draw
        a.sum().backward()
        assert all(p.grad is not None for p in m.parameters())


def test_bad_options_and_inputs_are_refused_clearly():
    with pytest.raises(ValueError, match="eps"):
        pipelstm.LayerNormLSTM(3, 4, eps=-1.0)
    with pytest.raises(ValueError, match="zoneout"):
        pipelstm.LayerNormLSTM(3, 4, zoneout=1.0)
    m = pipelstm.LayerNormLSTM(3, 4)
    with pytest.raises(RuntimeError, match="LayerNormLSTM: torch.jit.script"):
        torch.jit.script(m)
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size"):
        m(torch.randn(2, 1, 5))
    w = direction_weights(m, 0, False)
    x, h = torch.randn(2, 1, 3), torch.zeros(1, 4)
    op = torch.ops.pipelstm.lstm_layernorm_layer_forward
    with pytest.raises(RuntimeError, match="both `keep_c` and `keep_h`"):
        op(x, None, h, h, w["w_ih"], w["w_hh"], w["bias"], w["g_ih"], w["g_hh"], w["g_c"], w["b_c"],
           torch.zeros(2, 1, 4), None, False, EPS)
    with pytest.raises(RuntimeError, match="expected `gamma_hh` of shape \\[16\\]"):
        op(x, None, h, h, w["w_ih"], w["w_hh"], w["bias"], w["g_ih"], w["g_c"], w["g_c"], w["b_c"], None, None, False,
           EPS)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        op(x.half(), None, h.half(), h.half(), *(w[k].half() for k in ("w_ih", "w_hh", "bias", "g_ih", "g_hh", "g_c",
                                                                       "b_c")), None, None, False, EPS)


def test_torch_export_keeps_the_fused_op():
    torch.manual_seed(15)
    m = randomised(pipelstm.LayerNormLSTM(4, 6, 2), seed=16).eval()
    x = torch.randn(5, 2, 4)
    program = torch.export.export(m, (x,))
    assert any("lstm_layernorm_layer_forward" in str(n.target) for n in program.graph.nodes)
    torch.testing.assert_close(program.module()(x)[0], m(x)[0], atol=0, rtol=0)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_onnx_export_runs_the_composition(tmp_path, exporter):
    ort = pytest.importorskip("onnxruntime")
    import contextlib
    import io
    import warnings

    torch.manual_seed(17)
    m = randomised(pipelstm.LayerNormLSTM(4, 6, bidirectional=True), seed=18).eval()
    x = torch.randn(5, 2, 4)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(path), dynamo=exporter == "dynamo")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), m(x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed,zoned", [(False, False), (True, True)])
def test_opcheck_schema_fake_kernel_and_autograd(packed, zoned):
    torch.manual_seed(19)
    m = randomised(pipelstm.LayerNormLSTM(3, 4, dtype=torch.float64), seed=20)
    w = direction_weights(m, 0, False)
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    batch_sizes = None
    if packed:
        p = pack_padded_sequence(x, torch.tensor([4, 2]))
        x, batch_sizes = p.data, p.batch_sizes
    h = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    keep = [(torch.rand(x.shape[:-1] + (4,), dtype=torch.float64) < 0.3).double() for _ in range(2)] if zoned \
        else [None, None]
    args = (x, batch_sizes, h, h.detach().clone().requires_grad_(), *(w[k].detach().requires_grad_() for k in (
        "w_ih", "w_hh", "bias", "g_ih", "g_hh", "g_c", "b_c")), *keep, True, EPS)
    torch.library.opcheck(torch.ops.pipelstm.lstm_layernorm_layer_forward.default, args)


def test_the_cell_is_one_step_of_the_layer_and_saves_whole():
    torch.manual_seed(21)
    cell = randomised(pipelstm.LayerNormLSTMCell(3, 4, dtype=torch.float64), seed=22)
    w = {"w_ih": cell.weight_ih, "w_hh": cell.weight_hh, "bias": cell.bias_ih + cell.bias_hh,
         "g_ih": cell.layer_norm_ih_weight, "g_hh": cell.layer_norm_hh_weight, "g_c": cell.layer_norm_c_weight,
         "b_c": cell.layer_norm_c_bias}
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    h0, c0 = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    h, c = cell(x, (h0, c0))
    for b in range(2):
        _, h_ref, c_ref = reference_direction(x[b:b + 1], h0[b], c0[b], w)
        torch.testing.assert_close(h[b], h_ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(c[b], c_ref, atol=1e-10, rtol=0)
    got = torch.autograd.grad((h * c).sum(), [x, *cell.parameters()])
    want = torch.autograd.grad(sum((r[1] * r[2]).sum() for r in (
        reference_direction(x[b:b + 1], h0[b], c0[b], w) for b in range(2))), [x, *cell.parameters()])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    h1, c1 = cell(x[0])  # unbatched, zero state
    assert h1.shape == (4,) and c1.shape == (4,)
    with pytest.raises(RuntimeError, match="LayerNormLSTMCell: torch.jit.script"):
        torch.jit.script(cell)


def test_whole_models_load_with_weights_only(tmp_path):
    model = pipelstm.LayerNormLSTM(3, 4, zoneout=0.1).eval()
    cell = pipelstm.LayerNormLSTMCell(3, 4, bias=False)
    torch.save([model, cell], tmp_path / "m.pt")
    loaded, loaded_cell = torch.load(tmp_path / "m.pt", weights_only=True)
    x = torch.randn(2, 1, 3)
    torch.testing.assert_close(loaded(x)[0], model(x)[0], atol=0, rtol=0)
    torch.testing.assert_close(loaded_cell(x[0])[0], cell(x[0])[0], atol=0, rtol=0)
