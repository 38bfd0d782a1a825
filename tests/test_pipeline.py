"""pipelstm.Pipeline: the pipelined model equals the same model on one device.

Exactness (docs/design/pipeline.md), with one thread on both sides:

* bitwise: outputs and final states equal those of the same model's modules
  run on the same pieces as the pipeline (``run_reference_pieces``: the batch
  split into M micro-batches, time into K chunks, states carried from chunk
  to chunk; each ``nn.Linear`` as the pipeline's Linear unit computes it,
  ``pipelstm._C._linear``). The same ops on the same shapes, so this holds
  on any machine.
* within 1e-6 relative (max-abs) error against the unsplit model
  (``run_reference``), for outputs, states and all gradients: a GEMM over
  fewer rows (T/K*B or B/M instead of T*B or B) may pick another kernel and
  round differently, and parameter gradients are sums over pieces in another
  order. With K = M = 1 the one piece is the unsplit model, its
  ``nn.Linear`` run as the Linear units run it (the kernels' GEMM where
  PIPELSTM_CPU_GEMM picks it, where nn.Linear runs MKL's): bitwise there.
* with dropout on (training), in float64: within 1e-12 of the unsplit model
  with every dropout replaced by the mask the pass drew (read from the
  pipeline with tests/pipeline_masks.py), for outputs, states and gradients.

The pipeline's pieces have files of their own: test_pipeline_units.py
(flattening, unsupported modules), test_pipeline_balance.py (partition,
costs), test_pipeline_placement.py (devices, threads),
test_pipeline_core.py (PipelineCore) and test_pipeline_plan.py (the table).
"""

import copy
import json
import threading

import pytest
import torch
from torch import nn

import pipelstm

from pipeline_masks import pipeline_masks, run_masked
from pipeline_models import lm_model
from reference import num_threads, rel_error

TOL = 1e-6


def run_reference(model: nn.Sequential, x, hx=None):
    """The unsplit model, as Pipeline reads the Sequential: LSTMs return a
    tuple whose output goes on and whose final states are collected."""
    hs, cs = [], []
    layer = 0
    for child in model:
        if isinstance(child, nn.RNNBase):
            n = child.num_layers
            sub = None if hx is None else (hx[0][layer : layer + n], hx[1][layer : layer + n])
            x, (h, c) = child(x, sub)
            hs.append(h)
            cs.append(c)
            layer += n
        else:
            x = child(x)
    return x, (torch.cat(hs), torch.cat(cs))


def run_reference_pieces(model: nn.Sequential, x, hx, K, M):
    """The unsplit model's modules run on the pieces the pipeline runs: the
    batch split into M micro-batches and time into K chunks as
    torch.tensor_split does (the first T % K chunks one step longer, the same
    for B; K and M clamped to T and B), each micro-batch chunk after chunk,
    every LSTM carrying its layers' (h, c) from one chunk to the next.

    Like the pipeline, it works time-major: a batch_first input is transposed
    once, only the (batch_first) LSTMs see their pieces batch-major, and the
    output is transposed back. An ``nn.Linear`` runs as the pipeline's
    Linear unit runs it (``pipelstm._C._linear``: the GEMM of
    PIPELSTM_CPU_GEMM's choice). (A stacked LSTM without dropout, or in eval,
    equals its layers run one after another, which is what the pipeline's
    single-layer units do.) Returns ``output, (h_n, c_n)``: the chunks'
    outputs concatenated along time, the micro-batches' along the batch, and
    the final states of all layers concatenated along the batch.
    """
    batch_first = any(isinstance(c, nn.RNNBase) and c.batch_first for c in model)
    x = x.transpose(0, 1) if batch_first else x
    T, B = x.shape[0], x.shape[1]
    K, M = min(K, T), min(M, B)
    lstms, layer = [], 0  # (index in the Sequential, its first layer, its number of layers)
    for i, child in enumerate(model):
        if isinstance(child, nn.RNNBase):
            lstms.append((i, layer, child.num_layers))
            layer += child.num_layers
    hx_parts = [None] * M if hx is None else list(zip(*(t.tensor_split(M, dim=1) for t in hx)))

    outs, h_parts, c_parts = [], [], []
    for x_m, hx_m in zip(x.tensor_split(M, dim=1), hx_parts):
        states = {i: None if hx_m is None else (hx_m[0][l : l + n], hx_m[1][l : l + n]) for i, l, n in lstms}
        chunks = []
        for piece in x_m.tensor_split(K, dim=0):
            for i, child in enumerate(model):
                if isinstance(child, nn.Linear):
                    piece = pipelstm._C._linear(piece, child.weight, child.bias)
                elif i not in states:
                    piece = child(piece)
                elif child.batch_first:
                    piece, states[i] = child(piece.transpose(0, 1), states[i])
                    piece = piece.transpose(0, 1)
                else:
                    piece, states[i] = child(piece, states[i])
            chunks.append(piece)
        outs.append(torch.cat(chunks, dim=0))
        h_parts.append(torch.cat([states[i][0] for i, _, _ in lstms]))
        c_parts.append(torch.cat([states[i][1] for i, _, _ in lstms]))
    out = torch.cat(outs, dim=1)
    return out.transpose(0, 1) if batch_first else out, (torch.cat(h_parts, dim=1), torch.cat(c_parts, dim=1))


def proj_model(lstm_cls=pipelstm.LSTM, I=4):
    # units: 0.l0, 0.l1, 1 (projected LSTM without biases, then a decoder)
    return nn.Sequential(lstm_cls(I, 8, num_layers=2, proj_size=3, bias=False), nn.Linear(3, 2))


def compare(model_fn, x, hx, balance, K, M, check_input_grad, same_kernels=True):
    """The Pipeline (threads=1) against the unsplit model (one thread): within
    TOL for outputs, states and all gradients. With ``same_kernels``
    (pipelstm.LSTM models, not nn.LSTM) outputs and states are also bitwise
    those of the model run on the pipeline's pieces (for K = M = 1, one
    piece: the unsplit model, its Linear layers run as the units run them)."""
    torch.manual_seed(1)
    base = model_fn()
    ref, pieces, piped = (copy.deepcopy(base).eval() for _ in range(3))  # dropout off
    pipe = pipelstm.Pipeline(piped, devices=["cpu"] * len(balance), chunks=K, micro_batches=M, balance=balance,
                             threads=1)
    x_ref, x_pipe = x.clone(), x.clone()
    if check_input_grad:
        x_ref.requires_grad_(), x_pipe.requires_grad_()
    hx_ref = hx_pipe = None
    if hx is not None:
        hx_ref = tuple(t.clone().requires_grad_() for t in hx)
        hx_pipe = tuple(t.clone().requires_grad_() for t in hx)

    with num_threads(1):
        out_r, (h_r, c_r) = run_reference(ref, x_ref, hx_ref)
    out_p, (h_p, c_p) = pipe(x_pipe, hx_pipe)

    assert out_p.shape == out_r.shape and h_p.shape == h_r.shape and c_p.shape == c_r.shape
    if same_kernels:
        with num_threads(1):  # the same ops on the same shapes: the same bits, on any machine
            out_s, (h_s, c_s) = run_reference_pieces(pieces, x, hx, K, M)
        assert torch.equal(out_p, out_s)
        assert torch.equal(h_p, h_s) and torch.equal(c_p, c_s)
    for a, b in ((out_p, out_r), (h_p, h_r), (c_p, c_r)):
        assert rel_error(a, b) <= TOL

    g_out, g_h, g_c = torch.randn_like(out_r), torch.randn_like(h_r), torch.randn_like(c_r)
    with num_threads(1):
        ((out_r * g_out).sum() + (h_r * g_h).sum() + (c_r * g_c).sum()).backward()
    ((out_p * g_out).sum() + (h_p * g_h).sum() + (c_p * g_c).sum()).backward()

    names_r = [n for n, _ in ref.named_parameters()]
    names_p = [n for n, _ in pipe.named_parameters()]
    assert names_p == names_r
    for (n, p_r), p_p in zip(ref.named_parameters(), pipe.parameters()):
        assert p_p.grad is not None, n
        assert rel_error(p_p.grad, p_r.grad) <= TOL, n
    if check_input_grad:
        assert rel_error(x_pipe.grad, x_ref.grad) <= TOL
    if hx is not None:
        for a, b in zip(hx_pipe, hx_ref):
            assert rel_error(a.grad, b.grad) <= TOL
    return pipe


LM_BALANCES = [[6], [1, 5], [3, 3], [2, 2, 2], [1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("K", [1, 2, 7])
@pytest.mark.parametrize("balance", LM_BALANCES, ids=lambda b: "-".join(map(str, b)))
def test_language_model_matches_unsplit(balance, K, M):
    T, B = 11, 5  # divisible by neither K nor M
    x = torch.randint(0, 37, (T, B))
    hx = (torch.randn(3, B, 8), torch.randn(3, B, 8))
    compare(lm_model, x, hx, balance, K, M, check_input_grad=False)


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("K", [1, 2, 7])
@pytest.mark.parametrize("balance", [[3], [1, 2], [2, 1], [1, 1, 1]], ids=lambda b: "-".join(map(str, b)))
def test_projected_lstm_matches_unsplit(balance, K, M):
    T, B = 9, 4
    x = torch.randn(T, B, 4)
    hx = (torch.randn(2, B, 3), torch.randn(2, B, 8))
    compare(proj_model, x, hx, balance, K, M, check_input_grad=True)


def pointwise_model():
    # 13 units: 0, 1, 2.l0, 3, 4, 5.l0, 5.l1, 6, ..., 11 (every activation; LayerNorm with and without bias)
    return nn.Sequential(
        nn.Linear(4, 6), nn.GELU(approximate="tanh"), pipelstm.LSTM(6, 8), nn.LayerNorm(8), nn.SiLU(),
        pipelstm.LSTM(8, 8, num_layers=2), nn.LayerNorm(8, bias=False), nn.Tanh(), nn.Sigmoid(), nn.ReLU(),
        nn.GELU(), nn.Linear(8, 3),
    )


def mish_model():
    # 5 units: Mish (the activation added last) on a Linear's output and on an LSTM layer's
    return nn.Sequential(nn.Linear(4, 6), nn.Mish(), pipelstm.LSTM(6, 8), nn.Mish(), nn.Linear(8, 3))


POINTWISE = [(pointwise_model, 3, [13]), (pointwise_model, 3, [3, 10]), (pointwise_model, 3, [6, 4, 3]),
             (mish_model, 1, [5]), (mish_model, 1, [2, 3]), (mish_model, 1, [1, 2, 2])]


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("K", [1, 2, 7])
@pytest.mark.parametrize("model_fn, layers, balance", POINTWISE,
                         ids=[f"{f.__name__}-{'-'.join(map(str, b))}" for f, _, b in POINTWISE])
def test_pointwise_layers_match_unsplit(model_fn, layers, balance, K, M):
    T, B = 9, 4
    x = torch.randn(T, B, 4)
    hx = (torch.randn(layers, B, 8), torch.randn(layers, B, 8))
    compare(model_fn, x, hx, balance, K, M, check_input_grad=True, same_kernels=False)


@pytest.mark.parametrize("K, M", [(1, 1), (7, 3)])
def test_nn_lstm_model_matches_unsplit(K, M):
    # The unsplit nn.LSTM runs torch's own kernels, the pipeline pipelstm's:
    # equal within the tolerance, not bitwise.
    T, B = 9, 4
    x = torch.randn(T, B, 4)
    hx = (torch.randn(2, B, 3), torch.randn(2, B, 8))
    compare(lambda: proj_model(nn.LSTM), x, hx, [1, 2], K, M, check_input_grad=True, same_kernels=False)


def test_without_initial_state_and_only_state_loss():
    torch.manual_seed(0)
    base = lm_model()
    pipe = pipelstm.Pipeline(copy.deepcopy(base).eval(), devices=["cpu", "cpu"], chunks=3, micro_batches=2,
                             balance=[2, 4], threads=1)
    ref = copy.deepcopy(base).eval()
    x = torch.randint(0, 37, (8, 4))
    with num_threads(1):
        _, (h_r, _) = run_reference(ref, x)
        h_r.sum().backward()
    _, (h_p, _) = pipe(x)
    h_p.sum().backward()  # no gradient reaches the output: the decoder gets none
    for (n, p_r), p_p in zip(ref.named_parameters(), pipe.parameters()):
        if p_r.grad is None:
            assert p_p.grad is None or not p_p.grad.any(), n
        else:
            assert rel_error(p_p.grad, p_r.grad) <= TOL, n


@pytest.mark.parametrize("K, M", [(2, 1), (3, 3)])
def test_batch_first_and_no_grad(K, M):
    torch.manual_seed(0)
    base = nn.Sequential(pipelstm.LSTM(3, 6, num_layers=2, batch_first=True), nn.Linear(6, 2))
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu", "cpu"], chunks=K, micro_batches=M, balance=[1, 2],
                             threads=1)
    x = torch.randn(4, 7, 3)  # [B, T, I]
    with torch.no_grad(), num_threads(1):
        out_r, (h_r, c_r) = run_reference(base, x)
        out_s, (h_s, c_s) = run_reference_pieces(base, x, None, K, M)
    with torch.no_grad():
        out_p, (h_p, c_p) = pipe(x)
    assert out_p.shape == (4, 7, 2) and not out_p.requires_grad
    assert torch.equal(out_p, out_s) and torch.equal(h_p, h_s) and torch.equal(c_p, c_s)
    for a, b in ((out_p, out_r), (h_p, h_r), (c_p, c_r)):
        assert rel_error(a, b) <= TOL


def test_state_dict_is_the_unsplit_models():
    base = lm_model()
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu", "cpu", "cpu"], balance=[2, 2, 2])
    sd, ref = pipe.state_dict(), base.state_dict()
    assert list(sd.keys()) == list(ref.keys())
    for k in ref:
        assert torch.equal(sd[k], ref[k]), k
    other = lm_model()
    pipe.load_state_dict(other.state_dict())
    for k, v in other.state_dict().items():
        assert torch.equal(pipe.state_dict()[k], v)


def run_step(pipe, x, hx, seed=2):
    """One forward and backward with a fixed random loss; returns the outputs, states and gradients."""
    pipe.zero_grad()
    out, (h, c) = pipe(x, hx)
    torch.manual_seed(seed)
    ((out * torch.randn_like(out)).sum() + (h * torch.randn_like(h)).sum() + (c * torch.randn_like(c)).sum()).backward()
    return [out, h, c] + [p.grad for p in pipe.parameters()]


def test_deepcopy_is_an_independent_pipeline():
    torch.manual_seed(0)
    pipe = pipelstm.Pipeline(lm_model().eval(), devices=["cpu", "cpu"], balance=[2, 4], chunks=3, micro_batches=2,
                             threads=1)
    twin = copy.deepcopy(pipe)
    assert isinstance(twin, pipelstm.Pipeline) and twin.core.engine is not pipe.core.engine
    assert (twin.balance, twin.chunks, twin.micro_batches, twin.training) == ([2, 4], 3, 2, False)
    # its units run its own modules
    assert all(u.module is twin._modules[u.name.split(".")[0]] for u in twin.core.units)
    names = [n for n, _ in pipe.named_parameters()]
    assert [n for n, _ in twin.named_parameters()] == names
    for p, q in zip(pipe.parameters(), twin.parameters()):
        assert p is not q and torch.equal(p, q)

    x = torch.randint(0, 37, (8, 4))
    hx = (torch.randn(3, 4, 8), torch.randn(3, 4, 8))
    for a, b, what in zip(run_step(pipe, x, hx), run_step(twin, x, hx), ["output", "h_n", "c_n"] + names):
        assert torch.equal(a, b), what

    # Training the copy leaves the original alone.
    before = [p.detach().clone() for p in pipe.parameters()]
    out_before, _ = pipe(x, hx)
    torch.optim.SGD(twin.parameters(), lr=0.5).step()
    assert any(not torch.equal(p, q) for p, q in zip(twin.parameters(), before))
    assert all(torch.equal(p, q) for p, q in zip(pipe.parameters(), before))
    assert torch.equal(pipe(x, hx)[0], out_before)
    assert not torch.equal(twin(x, hx)[0], out_before)


def test_save_and_load_the_whole_pipeline(tmp_path):
    torch.manual_seed(0)
    pipe = pipelstm.Pipeline(proj_model().eval(), devices=["cpu", "cpu"], balance=[1, 2], chunks=2, micro_batches=2,
                             threads=1)
    path = tmp_path / "pipe.pt"
    torch.save(pipe, path)
    loaded = torch.load(path, weights_only=False)  # a whole module, not only tensors
    assert isinstance(loaded, pipelstm.Pipeline) and loaded.balance == [1, 2]
    assert [u.name for u in loaded.core.units] == [u.name for u in pipe.core.units]
    x = torch.randn(5, 3, 4)
    hx = (torch.randn(2, 3, 3), torch.randn(2, 3, 8))
    for a, b in zip(run_step(pipe, x, hx), run_step(loaded, x, hx)):
        assert torch.equal(a, b)


def test_dropout_statistics_and_eval():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), pipelstm.LSTM(64, 4, num_layers=2, dropout=0.5))
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu", "cpu"], chunks=2, micro_batches=2, threads=1,
                             balance=[2, 3])
    assert [u.name for u in pipe.core.units] == ["0", "1", "2.l0", "2.dropout0", "2.l1"]
    x = torch.randn(10, 6, 4)
    # The first stage's output in training mode: about half the activations dropped, the rest scaled by 2.
    first = pipelstm.Pipeline(nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5)), devices=["cpu"], chunks=3,
                              micro_batches=2, threads=1)
    with torch.no_grad():
        y, _ = first(x)
        plain = first[0](x)
    dropped = (y == 0).float().mean().item()
    assert 0.4 < dropped < 0.6
    kept = y != 0
    assert torch.allclose(y[kept], 2 * plain[kept], atol=1e-5)
    # Gradients follow the mask: those of the unsplit Linear times the same mask.
    masks = pipeline_masks(first.core, x, seed=3)
    x_p, x_r = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(10, 6, 64)
    torch.manual_seed(3)
    y, _ = first(x_p)
    (y * g).sum().backward()
    ref_linear = copy.deepcopy(first[0])
    ref_linear.zero_grad(set_to_none=True)
    with num_threads(1):
        y_r = ref_linear(x_r) * masks["1"]
        (y_r * g).sum().backward()
    assert rel_error(y, y_r) <= TOL
    for what, a, b in (("weight", first[0].weight.grad, ref_linear.weight.grad),
                       ("bias", first[0].bias.grad, ref_linear.bias.grad), ("input", x_p.grad, x_r.grad)):
        err = rel_error(a, b)
        assert err <= TOL, (f"gradient of the {what}", err)
    # eval: no dropout, equal to the unsplit model.
    pipe.eval()
    with torch.no_grad(), num_threads(1):
        out_r, _ = run_reference(base.eval(), x)
        out_p, _ = pipe(x)
    assert rel_error(out_p, out_r) <= TOL


def dropout_lm_model():
    # units: 0, 1.l0, 1.dropout0, 1.l1, 1.dropout1, 1.l2, 2, 3
    return nn.Sequential(nn.Embedding(37, 6), pipelstm.LSTM(6, 8, num_layers=3, dropout=0.3), nn.Dropout(0.25),
                         nn.Linear(8, 5)).double()


def dropout_features_model():
    # units: 0 (a dropout on the input itself), 1.l0, 1.dropout0, 1.l1, 2, 3, 4
    return nn.Sequential(nn.Dropout(0.4), nn.LSTM(4, 8, num_layers=2, proj_size=3, dropout=0.5), nn.Tanh(),
                         nn.Dropout(0.2), nn.Linear(3, 2)).double()


@pytest.mark.parametrize("model_fn, balance, K, M", [
    (dropout_lm_model, [8], 1, 1),
    (dropout_lm_model, [3, 5], 3, 2),
    (dropout_lm_model, [2, 2, 4], 7, 3),
    (dropout_features_model, [7], 1, 1),
    (dropout_features_model, [1, 3, 3], 2, 3),
], ids=["lm-1", "lm-2", "lm-3", "features-1", "features-3"])
def test_dropout_gradients_match_unsplit_with_the_same_masks(model_fn, balance, K, M):
    # Training mode, in float64: outputs, final states and every gradient
    # (parameters, initial states, the input) equal those of the unsplit
    # model (plain-torch layers) multiplied by the masks the pass drew.
    torch.manual_seed(1)
    base = model_fn()
    ref = copy.deepcopy(base)
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu"] * len(balance), chunks=K, micro_batches=M,
                             balance=balance, threads=1)
    assert pipe.training and sum(u.kind == "dropout" for u in pipe.core.units) == 3
    T, B = 11, 5
    L = pipe.core.num_layers
    H, P = (8, 8) if model_fn is dropout_lm_model else (8, 3)
    x = torch.randint(0, 37, (T, B)) if model_fn is dropout_lm_model else torch.randn(T, B, 4, dtype=torch.float64)
    hx = (torch.randn(L, B, P, dtype=torch.float64), torch.randn(L, B, H, dtype=torch.float64))
    masks = pipeline_masks(pipe.core, x, seed=11)
    assert all(0.05 < (m == 0).double().mean() < 0.7 for m in masks.values())  # masks, not all ones or zeros

    leaves_p = [x.clone().requires_grad_() if x.is_floating_point() else x] + [t.clone().requires_grad_() for t in hx]
    leaves_r = [x.clone().requires_grad_() if x.is_floating_point() else x] + [t.clone().requires_grad_() for t in hx]
    torch.manual_seed(11)
    out_p, (h_p, c_p) = pipe(leaves_p[0], tuple(leaves_p[1:]))
    out_r, (h_r, c_r) = run_masked(ref, leaves_r[0], tuple(leaves_r[1:]), masks)
    for what, a, b in (("output", out_p, out_r), ("h_n", h_p, h_r), ("c_n", c_p, c_r)):
        err = rel_error(a, b)
        assert err <= 1e-12, (what, err)  # the same masks (else the outputs differ by O(1))

    gen = torch.Generator().manual_seed(2)
    g = [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in (out_r, h_r, c_r)]
    sum((t * gt).sum() for t, gt in zip((out_p, h_p, c_p), g)).backward()
    sum((t * gt).sum() for t, gt in zip((out_r, h_r, c_r), g)).backward()
    got = [p.grad for p in pipe.parameters()] + [t.grad for t in leaves_p if t.is_floating_point()]
    expected = [p.grad for p in ref.parameters()] + [t.grad for t in leaves_r if t.is_floating_point()]
    names = [n for n, _ in ref.named_parameters()] + (["input"] if x.is_floating_point() else []) + ["h0", "c0"]
    for n, a, b in zip(names, got, expected):
        assert a is not None, n
        err = rel_error(a, b)
        assert err <= 1e-12, (f"gradient of {n}", err)


def test_schedule_is_a_wavefront():
    torch.manual_seed(0)
    K, M = 4, 3
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu"] * 3, chunks=K, micro_batches=M, balance=[2, 2, 2],
                             threads=1)
    x = torch.randint(0, 37, (9, 7))
    threads_before = torch.get_num_threads()
    out, _ = pipe(x)
    out.sum().backward()
    assert torch.get_num_threads() == threads_before  # the stages' budgets stay in the stages
    trace = pipe.trace()
    for phase, before, prev in (("forward", -1, -1), ("backward", +1, +1)):
        spans = {}
        for e in trace:
            if e["phase"] == phase:
                key = (e["stage"], e["micro_batch"], e["chunk"])
                assert key not in spans, f"{phase} {key} ran twice"
                spans[key] = (e["start_ns"], e["end_ns"])
        assert set(spans) == {(s, m, k) for s in range(3) for m in range(M) for k in range(K)}
        for (s, m, k), (start, _) in spans.items():
            # the neighbour stage (s-1 forward, s+1 backward) finished this item first
            if (s + before, m, k) in spans:
                assert start >= spans[(s + before, m, k)][1]
            # and this stage finished the neighbouring chunk (k-1 forward, k+1 backward)
            if (s, m, k + prev) in spans:
                assert start >= spans[(s, m, k + prev)][1]
    # forward all ran before backward
    last_fwd = max(e["end_ns"] for e in trace if e["phase"] == "forward")
    assert all(e["start_ns"] >= last_fwd for e in trace if e["phase"] == "backward")


# --- failures in a stage -------------------------------------------------------------


def run_with_timeout(fn, timeout=60):
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the pipeline hung"
    return result


def test_error_in_a_stage_names_stage_and_unit():
    # The decoder expects 7 features but the LSTM gives 8: stage 1 fails at run time.
    model = nn.Sequential(nn.Embedding(10, 4), pipelstm.LSTM(4, 8), nn.Linear(7, 3))
    pipe = pipelstm.Pipeline(model, devices=["cpu", "cpu"], balance=[2, 1], chunks=3, micro_batches=2, threads=1)
    r = run_with_timeout(lambda: pipe(torch.randint(0, 10, (6, 4))))
    err = r.get("error")
    assert isinstance(err, RuntimeError)
    assert "stage 1" in str(err) and "'2'" in str(err) and "Linear" in str(err)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_injected_fault_reaches_the_caller_and_the_engine_recovers(phase):
    torch.manual_seed(0)
    base = lm_model()
    pipe = pipelstm.Pipeline(copy.deepcopy(base).eval(), devices=["cpu"] * 3, balance=[2, 2, 2], chunks=3,
                             micro_batches=2, threads=1)
    x = torch.randint(0, 37, (7, 4))
    pipelstm._C.pipeline.inject_fault(3, phase, 1, 1)  # unit 3 = LSTM layer 1.l2, on stage 1

    def step():
        out, _ = pipe(x)
        out.sum().backward()

    err = run_with_timeout(step).get("error")
    assert isinstance(err, RuntimeError)
    assert "stage 1" in str(err) and "1.l2" in str(err) and phase in str(err) and "injected fault" in str(err)
    # Nothing half-finished stays behind: the next pass runs and is right.
    pipelstm._C.pipeline.clear_faults()
    pipe.zero_grad()
    out, _ = pipe(x)
    with num_threads(1):
        ref, _ = run_reference(copy.deepcopy(base).eval(), x)
    assert rel_error(out, ref) <= TOL
    out.sum().backward()


def test_backward_twice_raises():
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu"], threads=1)
    out, _ = pipe(torch.randint(0, 37, (3, 2)))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        out.sum().backward()


# --- timeline ---------------------------------------------------------------------------


def test_timeline(tmp_path):
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], balance=[3, 3], chunks=3, micro_batches=2, threads=1)
    out, _ = pipe(torch.randint(0, 37, (8, 4)))
    out.sum().backward()
    path = tmp_path / "trace.json"
    summary = pipe.timeline(str(path))
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in spans} >= {"forward", "backward", "idle"}
    assert {e["tid"] for e in spans} == {0, 1}
    assert len([e for e in spans if e["cat"] == "forward"]) == 2 * 3 * 2
    assert 0 <= summary["forward_bubble"] <= 1 and 0 <= summary["backward_bubble"] <= 1
    assert summary["theoretical_bubble"] == pytest.approx(1 / 7)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "png" not in summary
    else:
        assert (tmp_path / "trace.png").stat().st_size > 0
