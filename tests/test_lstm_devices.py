"""pipelstm.LSTM(..., devices=[...]): the stacked layers pipelined over stages
equal torch.nn.LSTM with the same parameters.

The pipeline runs pipelstm's layer ops in pieces (K time chunks, M
micro-batches) and nn.LSTM runs torch's own kernels, so results are compared
within 1e-5 relative (max-abs) error, not bitwise (docs/design/pipeline.md,
"Exactness"). Both sides run with one intra-op thread.
"""

import contextlib
import copy
import io

import pytest
import torch
from torch import nn

import pipelstm

from pipeline_masks import pipeline_masks, run_masked_layers
from reference import num_threads, rel_error
from nn_lstm_rejections import FORWARD_CASES, assert_rejects_like_nn_lstm

TOL = 1e-5
DEVICES = ["cpu", "cpu"]


def make_pair(devices=DEVICES, chunks=1, micro_batches=1, balance="auto", **kw):
    """nn.LSTM and the pipelined pipelstm.LSTM, both initialised from the same seed."""
    torch.manual_seed(1)
    ref = nn.LSTM(**kw)
    torch.manual_seed(1)
    ours = pipelstm.LSTM(**kw, devices=devices, chunks=chunks, micro_batches=micro_batches, balance=balance,
                         threads=1)
    return ref, ours


def run(module, x, hx, grads, threads=None):
    """Forward, a backward of a random projection of (output, h_n, c_n);
    returns (outputs, grads of params, input, h0, c0)."""
    x = x.clone().requires_grad_()
    hx = None if hx is None else tuple(t.clone().requires_grad_() for t in hx)
    ctx = num_threads(threads) if threads else contextlib.nullcontext()
    with ctx:
        out, (h, c) = module(x, hx)
        if grads[0] is None:
            grads[:] = [torch.randn_like(out), torch.randn_like(h), torch.randn_like(c)]
        ((out * grads[0]).sum() + (h * grads[1]).sum() + (c * grads[2]).sum()).backward()
    states = [] if hx is None else [t.grad for t in hx]
    return [out, h, c], [p.grad for p in module.parameters()], [x.grad] + states


CONFIGS = {
    "hx": dict(kw=dict(num_layers=3), batch_first=False, hx=True, unbatched=False),
    "no-hx": dict(kw=dict(num_layers=3), batch_first=False, hx=False, unbatched=False),
    "batch-first": dict(kw=dict(num_layers=2, batch_first=True), batch_first=True, hx=True, unbatched=False),
    "proj-no-bias": dict(kw=dict(num_layers=3, proj_size=3, bias=False), batch_first=False, hx=True,
                         unbatched=False),
    "unbatched": dict(kw=dict(num_layers=2), batch_first=False, hx=True, unbatched=True),
    "unbatched-no-hx": dict(kw=dict(num_layers=2), batch_first=False, hx=False, unbatched=True),
}


@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_matches_nn_lstm(config, K, M):
    cfg = CONFIGS[config]
    I, H = 4, 6
    kw = dict(input_size=I, hidden_size=H, **cfg["kw"])
    ref, ours = make_pair(chunks=K, micro_batches=M, **kw)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]

    T, B = 8, 5  # divisible by neither K nor M
    L, P = kw["num_layers"], kw.get("proj_size", 0) or H
    if cfg["unbatched"]:
        x = torch.randn(T, I)
        hx = (torch.randn(L, P), torch.randn(L, H))
    else:
        x = torch.randn(B, T, I) if cfg["batch_first"] else torch.randn(T, B, I)
        hx = (torch.randn(L, B, P), torch.randn(L, B, H))
    if not cfg["hx"]:
        hx = None

    grads = [None, None, None]
    outs_r, pgrads_r, igrads_r = run(ref, x, hx, grads, threads=1)
    outs_p, pgrads_p, igrads_p = run(ours, x, hx, grads)
    for what, a, b in zip(("output", "h_n", "c_n"), outs_p, outs_r):
        assert a.shape == b.shape, what
        assert rel_error(a, b) <= TOL, what
    for (n, _), a, b in zip(ref.named_parameters(), pgrads_p, pgrads_r):
        assert a is not None and rel_error(a, b) <= TOL, n
    for what, a, b in zip(("input", "h0", "c0"), igrads_p, igrads_r):
        assert a is not None and rel_error(a, b) <= TOL, what


@pytest.mark.parametrize("balance", [[1, 1, 1], [2, 1], [1, 2]], ids=lambda b: "-".join(map(str, b)))
def test_given_balance_and_no_grad(balance):
    ref, ours = make_pair(devices=["cpu"] * len(balance), chunks=2, micro_batches=2, balance=balance,
                          input_size=3, hidden_size=5, num_layers=3)
    assert ours.balance == balance
    assert [r["units"] for r in ours.plan.rows] == [
        ["l0", "l1", "l2"][sum(balance[:s]) : sum(balance[: s + 1])] for s in range(len(balance))
    ]
    x = torch.randn(6, 4, 3)
    with torch.no_grad(), num_threads(1):
        out_r, (h_r, c_r) = ref(x)
    with torch.no_grad():
        out_p, (h_p, c_p) = ours(x)
    assert not out_p.requires_grad
    for a, b in ((out_p, out_r), (h_p, h_r), (c_p, c_r)):
        assert rel_error(a, b) <= TOL


def test_dropout_units_eval_and_train():
    kw = dict(input_size=4, hidden_size=32, num_layers=3, dropout=0.5)
    ref, ours = make_pair(chunks=2, micro_batches=2, **kw)
    assert [u.name for u in ours._pipeline.core.units] == ["l0", "dropout0", "l1", "dropout1", "l2"]
    x = torch.randn(6, 5, 4)
    ref.eval(), ours.eval()
    with torch.no_grad(), num_threads(1):
        out_r, (h_r, c_r) = ref(x)
    with torch.no_grad():
        out_e, (h_e, c_e) = ours(x)
    for a, b in ((out_e, out_r), (h_e, h_r), (c_e, c_r)):
        assert rel_error(a, b) <= TOL
    # Training: the inter-layer dropout is applied (the first layer, before any dropout, is unchanged).
    ours.train()
    masks = pipeline_masks(ours._pipeline.core, x, seed=4)
    assert list(masks) == ["dropout0", "dropout1"]
    xg, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(4)
    out_t, (h_t, c_t) = ours(xg)
    assert rel_error(out_t, out_e) > 1e-3
    assert torch.equal(h_t[0], h_e[0])
    # Outputs and gradients are nn.LSTM's, layer by layer, with the masks the pass drew between the layers.
    with num_threads(1):
        out_r, (h_r, c_r) = run_masked_layers(ref, xr, None, [masks["dropout0"], masks["dropout1"]])
    for what, a, b in (("output", out_t, out_r), ("h_n", h_t, h_r), ("c_n", c_t, c_r)):
        err = rel_error(a, b)
        assert err <= TOL, (what, err)
    grads = [torch.randn_like(t) for t in (out_r, h_r, c_r)]
    sum((t * g).sum() for t, g in zip((out_t, h_t, c_t), grads)).backward()
    with num_threads(1):
        sum((t * g).sum() for t, g in zip((out_r, h_r, c_r), grads)).backward()
    for (n, p_r), p_p in zip(ref.named_parameters(), ours.parameters()):
        assert p_p.grad is not None, n
        err = rel_error(p_p.grad, p_r.grad)
        assert err <= TOL, (f"gradient of {n}", err)
    err = rel_error(xg.grad, xr.grad)
    assert err <= TOL, ("gradient of the input", err)


def test_optimizer_step_matches_nn_lstm():
    kw = dict(input_size=4, hidden_size=6, num_layers=3, proj_size=2)
    ref, ours = make_pair(chunks=3, micro_batches=2, **kw)
    opt_r = torch.optim.Adam(ref.parameters(), lr=1e-2)
    opt_p = torch.optim.Adam(ours.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randn(7, 5, 4)
        target = torch.randn(7, 5, 2)
        for module, opt, threads in ((ref, opt_r, 1), (ours, opt_p, None)):
            with num_threads(threads) if threads else contextlib.nullcontext():
                out, _ = module(x)
                ((out - target) ** 2).mean().backward()
                opt.step()
                opt.zero_grad()
    before = make_pair(**kw)[0]
    for (n, p_r), p_p, p_0 in zip(ref.named_parameters(), ours.parameters(), before.parameters()):
        assert not torch.equal(p_r, p_0), n  # the step changed it
        assert rel_error(p_p, p_r) <= TOL, n


def test_state_dict_both_ways_repr_copy_and_pickle():
    ref, ours = make_pair(chunks=2, micro_batches=2, input_size=3, hidden_size=4, num_layers=2)
    plain = pipelstm.LSTM(3, 4, num_layers=2)
    assert repr(plain) == repr(ref) and "devices" not in repr(plain) and plain.devices is None
    assert repr(ours) == ("LSTM(3, 4, num_layers=2, devices=['cpu', 'cpu'], balance=[1, 1], chunks=2, "
                          "micro_batches=2)")
    assert ours.devices == [torch.device("cpu")] * 2
    ours.load_state_dict(plain.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    for k, v in plain.state_dict().items():
        assert torch.equal(ref.state_dict()[k], v), k

    x = torch.randn(5, 3, 3)
    with torch.no_grad():
        expected, _ = ours(x)
        clone = copy.deepcopy(ours)
        assert all(u.module is clone for u in clone._pipeline.core.units)
        assert all(a is not b for a, b in zip(clone.parameters(), ours.parameters()))
        assert torch.equal(clone(x)[0], expected)
        buf = io.BytesIO()
        torch.save(ours, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert torch.equal(loaded(x)[0], expected)


def test_plain_lstm_has_no_pipeline():
    m = pipelstm.LSTM(3, 4)
    assert m.devices is None and m.plan is None  # properties: TorchScript reads them all (test_jit.py)
    with pytest.raises(RuntimeError, match="only available for an LSTM constructed with devices="):
        m.timeline("t.json")


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_rejects_like_nn_lstm(case):
    assert_rejects_like_nn_lstm(case, lambda **kw: pipelstm.LSTM(**kw, devices=DEVICES, threads=1))


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_batch_of_no_sequences_gives_empty_results_as_nn_lstm(batch_first):
    # It used to raise "expected a non-empty input" (the engine's check).
    ref = nn.LSTM(3, 4, num_layers=2, proj_size=2, batch_first=batch_first)
    ours = pipelstm.LSTM(3, 4, num_layers=2, proj_size=2, batch_first=batch_first, devices=DEVICES, threads=1)
    ours.load_state_dict(ref.state_dict())
    results = []
    for m in (ref, ours):
        x = torch.randn((0, 5, 3) if batch_first else (5, 0, 3), requires_grad=True)
        for hx in (None, (torch.randn(2, 0, 2), torch.randn(2, 0, 4))):
            out, (h, c) = m(x, hx)
            (out.sum() + h.sum() + c.sum()).backward()
            results.append([out.shape, h.shape, c.shape, x.grad.shape]
                           + [None if p.grad is None else p.grad.abs().sum().item() for p in m.parameters()])
    assert results[:2] == results[2:]


def test_unsupported_input_and_placement_are_rejected():
    m = pipelstm.LSTM(3, 4, num_layers=2, devices=DEVICES, threads=1)
    x = torch.randn(5, 2, 3)
    with pytest.raises(RuntimeError, match=r"input is on meta, but the first pipeline stage runs on cpu"):
        m(torch.randn(5, 2, 3, device="meta"))
    m.weight_hh_l1 = nn.Parameter(torch.zeros(16, 4, device="meta"))
    with pytest.raises(RuntimeError, match=r"parameter weight_hh_l1 is on meta, but its pipeline stage runs on cpu"):
        m(x)


@pytest.mark.parametrize("kwargs, message", [
    (dict(bidirectional=True, devices=DEVICES), r"bidirectional=True cannot be pipelined"),
    (dict(devices=DEVICES, balance=[1, 2]), r"balance \[1, 2\] sums to 3, but the model has 2 units \(l0, l1\)"),
    (dict(devices=DEVICES, balance=[2]), r"positive unit count for each of the 2 stages"),
    (dict(devices=["cpu"] * 3), r"3 stages but only 2 units"),
    (dict(devices=[]), r"non-empty list of devices"),
    (dict(devices="cpu"), r"non-empty list of devices"),
    (dict(devices=["tpu"]), r"device"),
    (dict(devices=DEVICES, chunks=0), r"chunks must be a positive int"),
    (dict(devices=DEVICES, micro_batches=1.5), r"micro_batches must be a positive int"),
    (dict(chunks=2), r"only apply with devices="),
    (dict(balance=[1, 1]), r"only apply with devices="),
    (dict(checkpoint="always"), r"only apply with devices="),
    (dict(devices=DEVICES, threads=[1, 0]), r"LSTM: threads\[1\] = 0 for the CPU stage 1: expected 1 to"),
])
def test_invalid_constructions_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipelstm.LSTM(3, 4, num_layers=2, **kwargs)


def test_recomputation_matches_and_keeps_less():
    x = torch.randn(9, 4, 3)
    results = {}
    for mode in ("never", "always"):
        torch.manual_seed(1)
        lstm = pipelstm.LSTM(3, 16, num_layers=4, devices=DEVICES, chunks=3, micro_batches=2, threads=1,
                             checkpoint=mode)
        outs, grads, _ = run(lstm, x, None, [torch.ones(9, 4, 16), torch.ones(4, 4, 16), torch.ones(4, 4, 16)])
        results[mode] = (outs, grads, lstm.saved_activation_bytes)
    for a, b in zip(results["always"][0] + results["always"][1], results["never"][0] + results["never"][1]):
        assert torch.equal(a, b)
    assert results["always"][2] < results["never"][2] / 2
