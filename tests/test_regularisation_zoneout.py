"""pipelstm.LSTM(zoneout=...) and its op, pipelstm::lstm_zoneout_layer_forward,
against an independent reference: a plain loop over steps in float64 with
the keep masks pipelstm drew (recorded by replacing the mask function),
outputs and every gradient, dense and packed, one and two layers, both
directions, batch_first, with and without biases; gradcheck of the op;
then the masks (how many are kept, per element and step, the seed),
evaluation's expectation, the refusals, opcheck and torch.compile."""

import itertools

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from pipelstm import ops, regularisation

import reference

I, H = 3, 5


def ref_stack(lstm, x, h0, c0, keeps):
    """The stack over time-major x [T, B, I]; keeps[k] = (keep_c, keep_h) of
    layer-direction k, each [T, B, H]."""
    D = 2 if lstm.bidirectional else 1
    hs, cs = [], []
    for layer in range(lstm.num_layers):
        outs = []
        for d in range(D):
            k = layer * D + d
            get = lambda n: getattr(lstm, n + f"_l{layer}" + ("_reverse" if d else ""), None)  # noqa: E731
            out, h, c = reference.layer(x, h0[k], c0[k], get("weight_ih"), get("weight_hh"), get("bias_ih"),
                                        get("bias_hh"), None, d == 1, *keeps[k])
            outs.append(out)
            hs.append(h)
            cs.append(c)
        x = torch.cat(outs, dim=-1)
    return x, torch.stack(hs), torch.stack(cs)


@pytest.fixture
def recorded(monkeypatch):
    """The keep masks pipelstm draws, in order (from a generator of the
    test's own, so the reference gets the same)."""
    drawn = []
    gen = torch.Generator().manual_seed(11)

    def zoneout_mask(shape, p, like):
        m = (torch.rand(tuple(shape), generator=gen) < p).to(like.dtype).to(like.device)
        drawn.append(m)
        return m

    monkeypatch.setattr(regularisation, "zoneout_mask", zoneout_mask)
    return drawn


def _grads(tensors):
    return [t.grad.clone() for t in tensors]


def _pair(num_layers, bidirectional, bias, zoneout, batch_first=False):
    torch.manual_seed(3)
    lstm = pipelstm.LSTM(I, H, num_layers=num_layers, bidirectional=bidirectional, bias=bias, zoneout=zoneout,
                         batch_first=batch_first, dtype=torch.float64)
    ref = pipelstm.LSTM(I, H, num_layers=num_layers, bidirectional=bidirectional, bias=bias, dtype=torch.float64)
    ref.load_state_dict(lstm.state_dict())
    return lstm, ref


def _keeps_per_layer(drawn, zoneout, shape, L, training):
    """The (keep_c, keep_h) of each layer-direction, in the order they are drawn."""
    p_c, p_h = zoneout if isinstance(zoneout, tuple) else (zoneout, zoneout)
    it = iter(drawn)
    keeps = []
    for _ in range(L):
        pair = []
        for p in (p_c, p_h):
            pair.append(next(it) if training and p > 0 else torch.full(shape, p, dtype=torch.float64))
        keeps.append(tuple(pair))
    assert next(it, None) is None
    return keeps


CASES = list(itertools.product([1, 2], [False, True], [True, False], [(0.3, 0.2), 0.5, (0.0, 0.4)], [True, False]))


@pytest.mark.parametrize("num_layers, bidirectional, bias, zoneout, training", CASES)
@pytest.mark.parametrize("batch_first", [False, True])
def test_dense_matches_the_reference(recorded, num_layers, bidirectional, bias, zoneout, training, batch_first):
    T, B = 6, 4
    lstm, ref = _pair(num_layers, bidirectional, bias, zoneout, batch_first)
    lstm.train(training)
    D = 2 if bidirectional else 1
    x = torch.randn(T, B, I, dtype=torch.float64)
    h0 = torch.randn(num_layers * D, B, H, dtype=torch.float64)
    c0 = torch.randn(num_layers * D, B, H, dtype=torch.float64)
    xs = [t.clone().requires_grad_() for t in (x, h0, c0)]
    given = xs[0].transpose(0, 1) if batch_first else xs[0]
    out, (h_n, c_n) = lstm(given, (xs[1], xs[2]))
    if batch_first:
        out = out.transpose(0, 1)
    keeps = _keeps_per_layer(recorded, zoneout, (T, B, H), num_layers * D, training)
    ys = [t.clone().requires_grad_() for t in (x, h0, c0)]
    r_out, r_h, r_c = ref_stack(ref, *ys, keeps)
    torch.testing.assert_close(out, r_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(h_n, r_h, rtol=0, atol=1e-12)
    torch.testing.assert_close(c_n, r_c, rtol=0, atol=1e-12)
    w = [torch.randn_like(t) for t in (out, h_n, c_n)]
    sum((a * b).sum() for a, b in zip((out, h_n, c_n), w)).backward()
    sum((a * b).sum() for a, b in zip((r_out, r_h, r_c), w)).backward()
    for a, b in zip(_grads(xs) + _grads(list(lstm.parameters())), _grads(ys) + _grads(list(ref.parameters()))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("num_layers, bidirectional", [(1, False), (2, False), (1, True), (2, True)])
@pytest.mark.parametrize("training", [True, False])
def test_packed_matches_each_sequence_alone(recorded, num_layers, bidirectional, training):
    # The packed rows of sequence b at step t are row offset[t] + b: the
    # reference runs each sequence alone with its own rows of the masks.
    lengths = [6, 4, 4, 1]
    zoneout = (0.3, 0.4)
    lstm, ref = _pair(num_layers, bidirectional, True, zoneout)
    lstm.train(training)
    D = 2 if bidirectional else 1
    seqs = [torch.randn(n, I, dtype=torch.float64, requires_grad=True) for n in lengths]
    packed = pack_sequence(seqs)
    out, (h_n, c_n) = lstm(packed)
    rows = packed.data.size(0)
    keeps = _keeps_per_layer(recorded, zoneout, (rows, H), num_layers * D, training)
    offsets = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), packed.batch_sizes[:-1]]), 0)
    zeros = torch.zeros(num_layers * D, 1, H, dtype=torch.float64)
    loss_w = torch.randn_like(out.data)
    (out.data * loss_w).sum().backward()
    for b, n in enumerate(lengths):
        idx = offsets[:n] + b
        mine = [(kc[idx].unsqueeze(1), kh[idx].unsqueeze(1)) for kc, kh in keeps]
        x = seqs[b].detach().clone().requires_grad_().unsqueeze(1)
        r_out, r_h, r_c = ref_stack(ref, x, zeros, zeros, mine)
        torch.testing.assert_close(out.data[idx], r_out[:, 0], rtol=0, atol=1e-12)
        torch.testing.assert_close(h_n[:, b], r_h[:, 0], rtol=0, atol=1e-12)
        torch.testing.assert_close(c_n[:, b], r_c[:, 0], rtol=0, atol=1e-12)
        (r_out[:, 0] * loss_w[idx]).sum().backward()
    for a, b in zip(lstm.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("keep", ["masks", "probabilities"])
def test_the_op_passes_gradcheck_and_gradgradcheck(packed, reverse, keep):
    torch.manual_seed(0)
    T, B = 4, 3
    rnd = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    batch_sizes = torch.tensor([3, 3, 2, 1]) if packed else None
    rows = int(batch_sizes.sum()) if packed else T * B
    shape = (rows, H) if packed else (T, B, H)
    if keep == "masks":
        keep_c, keep_h = (torch.rand(shape, dtype=torch.float64) < 0.4).double(), (torch.rand(shape) < 0.3).double()
    else:
        keep_c, keep_h = torch.full((H,), 0.3, dtype=torch.float64).expand(shape), torch.rand(shape).double()
    x = rnd(rows, I) if packed else rnd(T, B, I)
    args = [x, rnd(B, H), rnd(B, H), rnd(4 * H, I), rnd(4 * H, H), rnd(4 * H), rnd(4 * H)]
    f = lambda x, h, c, wi, wh, bi, bh: ops.lstm_zoneout_layer(  # noqa: E731
        x, batch_sizes, h, c, wi, wh, bi, bh, keep_c, keep_h, reverse)
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)  # create_graph=True: the op's composition differentiated


def test_masks_keep_a_fraction_p_per_element_and_step():
    r = regularisation.Regularisation(zoneout=(0.3, 0.7))
    torch.manual_seed(0)
    like = torch.empty(0)
    keep_c, keep_h = r.keep_weights((50, 40, 30), True, like)
    assert set(keep_c.unique().tolist()) == {0.0, 1.0}
    assert abs(keep_c.mean().item() - 0.3) < 0.01 and abs(keep_h.mean().item() - 0.7) < 0.01
    assert not torch.equal(keep_c[0], keep_c[1]) and not torch.equal(keep_c[:, 0], keep_c[:, 1])
    ev_c, ev_h = r.keep_weights((50, 40, 30), False, like)
    assert torch.all(ev_c == 0.3) and torch.all(ev_h == 0.7)


def test_evaluation_is_deterministic_and_the_seed_reproduces_training():
    lstm = pipelstm.LSTM(I, H, num_layers=2, zoneout=0.4)
    x = torch.randn(7, 2, I)
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(lstm(x)[0])
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], lstm(x)[0])  # a new draw
    lstm.eval()
    assert torch.equal(lstm(x)[0], lstm(x)[0])


def test_float32_matches_float64_within_float32_error():
    torch.manual_seed(1)
    lstm = pipelstm.LSTM(I, H, num_layers=2, zoneout=(0.2, 0.1)).eval()
    x = torch.randn(20, 3, I)
    out32 = lstm(x)[0]
    out64 = lstm.double()(x.double())[0]
    torch.testing.assert_close(out32.double(), out64, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(zoneout=1.0), r"zoneout must be a probability in \[0, 1\), got 1\.0"),
    (dict(zoneout=(0.1,)), r"zoneout must be a probability or a pair \(p_c, p_h\), got \(0\.1,\)"),
    (dict(zoneout=(0.1, -0.2)), r"zoneout's p_h must be a probability in \[0, 1\), got -0\.2"),
    (dict(zoneout=0.1, proj_size=2), r"zoneout=\(0\.1, 0\.1\) with proj_size=2 is not supported"),
])
def test_bad_zoneout_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pipelstm.LSTM(I, H, **kwargs)


def test_paths_that_would_run_nn_lstm_refuse_zoneout():
    lstm = pipelstm.LSTM(I, H, zoneout=0.2).eval()
    with pytest.raises(RuntimeError, match=r"torch\.jit\.script runs torch's nn\.LSTM in place of pipelstm's"):
        torch.jit.script(lstm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_on_the_cpu_is_float32_rounded_once(dtype):
    # As the plain layer on the CPU: each layer op is the float32 op on
    # float32 copies, its results and gradients rounded to the dtype once.
    # In evaluation (keep probabilities the dtype holds exactly), bit for bit
    # a stack of float32 layers rounded where the module rounds: between them.
    torch.manual_seed(3)
    m = pipelstm.LSTM(I, H, num_layers=2, zoneout=(0.5, 0.25)).to(dtype).eval()
    layers = [pipelstm.LSTM(n, H, zoneout=(0.5, 0.25)).eval() for n in (I, H)]
    for k, layer in enumerate(layers):
        layer.load_state_dict({n.replace(f"_l{k}", "_l0"): v.float() for n, v in m.state_dict().items()
                               if n.endswith(f"_l{k}")})
    x = torch.randn(6, 2, I).to(dtype)
    out, (h, c) = m(x)
    mid, (h1, c1) = layers[0](x.float())
    want, (h2, c2) = layers[1](mid.to(dtype).float())
    assert out.dtype == dtype and torch.equal(out, want.to(dtype))
    assert torch.equal(h, torch.cat([h1, h2]).to(dtype)) and torch.equal(c, torch.cat([c1, c2]).to(dtype))
    grads = torch.autograd.grad(out.float().square().sum(), list(m.parameters()))
    want_grads = torch.autograd.grad(want.to(dtype).float().square().sum(),
                                     [p for layer in layers for p in layer.parameters()])
    for got, w in zip(grads, want_grads):
        assert got.dtype == dtype and torch.equal(got, w.to(dtype))
    m.train()
    out = m(x)[0]  # training: masks drawn, the same path
    out.float().sum().backward()
    assert out.dtype == dtype and all(p.grad.dtype == dtype for p in m.parameters())


def test_double_backward_matches_the_reference(recorded):
    lstm, ref = _pair(2, True, True, (0.3, 0.2))
    x = torch.randn(4, 2, I, dtype=torch.float64, requires_grad=True)

    def second_order(out, model):
        (g,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), [x, *model.parameters()])

    got = second_order(lstm(x)[0], lstm)
    zeros = torch.zeros(4, 2, H, dtype=torch.float64)
    keeps = _keeps_per_layer(recorded, (0.3, 0.2), (4, 2, H), 4, True)
    want = second_order(ref_stack(ref, x, zeros, zeros, keeps)[0], ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_op_under_torch_func_matches_the_reference(reverse):
    torch.manual_seed(0)
    T, B = 4, 3
    rnd = lambda *s: torch.randn(*s, dtype=torch.float64)  # noqa: E731
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = rnd(T, B, I), rnd(B, H), rnd(B, H), rnd(4 * H, I), rnd(4 * H, H), \
        rnd(4 * H), rnd(4 * H)
    keep_c, keep_h = (torch.rand(T, B, H) < 0.4).double(), (torch.rand(T, B, H) < 0.3).double()

    def ours(w, x=x):
        return ops.lstm_zoneout_layer(x, None, h0, c0, w_ih, w, b_ih, b_hh, keep_c, keep_h, reverse)[0].pow(2).sum()

    def theirs(w, x=x):
        return reference.layer(x, h0, c0, w_ih, w, b_ih, b_hh, None, reverse, keep_c, keep_h)[0].pow(2).sum()

    torch.testing.assert_close(torch.func.grad(ours)(w_hh), torch.func.grad(theirs)(w_hh), rtol=0, atol=1e-10)
    tangent = rnd(4 * H, H)
    torch.testing.assert_close(torch.func.jvp(ours, (w_hh,), (tangent,))[1],
                               torch.func.jvp(theirs, (w_hh,), (tangent,))[1], rtol=0, atol=1e-10)
    xs = rnd(2, T, B, I)  # vmap over a batch of inputs
    per_input = torch.func.vmap(torch.func.grad(ours), in_dims=(None, 0))(w_hh, xs)
    for k in range(2):
        torch.testing.assert_close(per_input[k], torch.func.grad(theirs)(w_hh, xs[k]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("keep_rows", [False, True], ids=["keep_as_output", "keep_as_rows"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_the_op_under_torch_func_matches_its_fused_gradients(packed, keep_rows, reverse):
    # The composition against the fused op's formula (checked against the
    # reference above): packed rows of sequences of different lengths, and
    # a dense call's keep weights as [T, B, H] or as rows [T * B, H].
    torch.manual_seed(0)
    T, B = 4, 3
    rnd = lambda *s: torch.randn(*s, dtype=torch.float64)  # noqa: E731
    batch_sizes = torch.tensor([3, 3, 2, 1]) if packed else None
    rows = int(batch_sizes.sum()) if packed else T * B
    x = rnd(rows, I) if packed else rnd(T, B, I)
    shape = (rows, H) if packed or keep_rows else (T, B, H)
    keep_c, keep_h = (torch.rand(shape) < 0.4).double(), (torch.rand(shape) < 0.3).double()
    weights = [rnd(B, H), rnd(B, H), rnd(4 * H, I), rnd(4 * H, H), rnd(4 * H), rnd(4 * H)]

    def loss(x, *w):
        out, h_n, c_n = ops.lstm_zoneout_layer(x, batch_sizes, *w, keep_c, keep_h, reverse)
        return out.pow(2).sum() + (h_n * c_n).sum()

    got = torch.func.grad(loss, argnums=tuple(range(7)))(x, *weights)
    leaves = [t.clone().requires_grad_() for t in (x, *weights)]
    want = torch.autograd.grad(loss(*leaves), leaves)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_the_module_under_torch_func_matches_its_fused_gradients():
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(I, H, num_layers=2, zoneout=(0.3, 0.2), dtype=torch.float64).eval()
    x = torch.randn(4, 2, I, dtype=torch.float64)
    params = dict(lstm.named_parameters())

    def loss(p):
        return torch.func.functional_call(lstm, p, (x,))[0].pow(2).sum()

    got = torch.func.grad(loss)(params)
    want = torch.autograd.grad(loss(params), list(params.values()))  # the fused op's formula
    for name, w in zip(params, want):
        torch.testing.assert_close(got[name], w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("packed", [False, True])
def test_opcheck(packed):
    torch.manual_seed(0)
    T, B = 3, 2
    rnd = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    batch_sizes = torch.tensor([2, 2, 1]) if packed else None
    rows = 5 if packed else T * B
    shape = (rows, H) if packed else (T, B, H)
    keep = (torch.rand(shape, dtype=torch.float64) < 0.5).double()
    x = rnd(rows, I) if packed else rnd(T, B, I)
    args = (x, batch_sizes, rnd(B, H), rnd(B, H), rnd(4 * H, I), rnd(4 * H, H), rnd(4 * H), None, keep, keep, False)
    torch.library.opcheck(torch.ops.pipelstm.lstm_zoneout_layer_forward, args)


def test_compiled_evaluation_matches_eager():
    lstm = pipelstm.LSTM(I, H, num_layers=2, zoneout=(0.3, 0.1)).eval()
    x = torch.randn(5, 2, I)
    compiled = torch.compile(lstm, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x)[0], lstm(x)[0], rtol=0, atol=0)


def test_exported_evaluation_matches_eager():
    lstm = pipelstm.LSTM(I, H, zoneout=(0.3, 0.1)).eval()
    x = torch.randn(5, 2, I)
    program = torch.export.export(lstm, (x,))
    assert any("lstm_zoneout_layer_forward" in str(n.target) for n in program.graph.nodes)
    torch.testing.assert_close(program.module()(x)[0], lstm(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize("hidden", [5, 37])
@pytest.mark.parametrize("packed, bidirectional", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("in_steps", ["0", "1"])
def test_float32_fused_loops_match_float64_with_the_same_masks(recorded, monkeypatch, hidden, packed,
                                                               bidirectional, in_steps):
    # float32 runs the CPU's fused loops (both ways of projecting the input),
    # float64 the step loop: the same masks, outputs and gradients within
    # float32's error.
    monkeypatch.setenv("PIPELSTM_INPUT_IN_STEPS", in_steps)
    torch.manual_seed(2)
    lstm = pipelstm.LSTM(I, hidden, num_layers=2, bidirectional=bidirectional, zoneout=(0.4, 0.3))
    ref = pipelstm.LSTM(I, hidden, num_layers=2, bidirectional=bidirectional, zoneout=(0.4, 0.3),
                        dtype=torch.float64)
    ref.load_state_dict(lstm.state_dict())
    lengths = [7, 7, 5, 2] if packed else [7] * 4
    seqs = [torch.randn(n, I) for n in lengths]
    make = (lambda s: pack_sequence(s)) if packed else (lambda s: torch.stack(s, 1))  # noqa: E731
    D = 2 if bidirectional else 1
    hx = [torch.randn(2 * D, len(lengths), hidden) for _ in range(2)]
    hx32 = [t.clone().requires_grad_() for t in hx]
    hx64 = [t.double().requires_grad_() for t in hx]
    x32 = make([s.clone().requires_grad_() for s in seqs])
    out32, (h32, c32) = lstm(x32, tuple(hx32))
    drawn = list(recorded)
    recorded.clear()
    recorded.extend(m.double() for m in drawn)
    it = iter(recorded)
    monkeypatch.setattr(regularisation, "zoneout_mask", lambda shape, p, like: next(it))
    out64, (h64, c64) = ref(make([s.double() for s in seqs]), tuple(hx64))
    data = (lambda o: o.data) if packed else (lambda o: o)  # noqa: E731
    for a, b in ((data(out32), data(out64)), (h32, h64), (c32, c64)):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
    w = torch.randn_like(data(out64))
    (data(out32) * w.float()).sum().backward()
    (data(out64) * w).sum().backward()
    for a, b in zip(lstm.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-4)
    for a, b in zip(hx32, hx64):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-4)
