"""PackedSequence input through the pipeline (LSTM(devices=) and Pipeline):
each work item is the packed rows of one micro-batch over one time chunk,
no padding anywhere, and the results equal the unsplit model's -- the
output, h_n, c_n and every gradient (input, initial states, parameters) --
against torch.nn.LSTM and pipelstm.LSTM without devices, to 1e-6 in fp32.
The configurations include micro-batches of uneven lengths and more chunks
than the short sequences have steps (items without rows)."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence

import pipelstm

TOL = dict(rtol=1e-6, atol=1e-6)
V, E, H = 23, 6, 8
# Uneven lengths: with K = 6 chunks the short micro-batches have no rows in the late chunks.
LENGTHS = [9, 2, 7, 1, 9, 3, 5]


def _packed(lengths, features, enforce_sorted, dtype=torch.float32, seed=1):
    """A PackedSequence of len(lengths) sequences ([T, features], or indices when features is None)."""
    g = torch.Generator().manual_seed(seed)
    if enforce_sorted:
        lengths = sorted(lengths, reverse=True)
    seqs = [torch.randint(0, V, (n,), generator=g) if features is None
            else torch.randn(n, features, generator=g, dtype=dtype) for n in lengths]
    return pack_sequence(seqs, enforce_sorted=enforce_sorted)


def _leaf(seq):
    data = seq.data.clone().requires_grad_(seq.data.is_floating_point())
    return seq._replace(data=data)


def _assert_grads(a: nn.Module, b: nn.Module):
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert pa.grad is not None and pb.grad is not None, name
        torch.testing.assert_close(pa.grad, pb.grad, **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("K, M", [(1, 1), (3, 2), (6, 3), (20, 7), (4, 5)])
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("with_hx", [False, True])
def test_lstm_devices_packed_matches_nn_lstm(K, M, enforce_sorted, with_hx):
    torch.manual_seed(0)
    ref = nn.LSTM(E, H, num_layers=3)
    plain = pipelstm.LSTM(E, H, num_layers=3)
    piped = pipelstm.LSTM(E, H, num_layers=3, devices=["cpu", "cpu"], chunks=K, micro_batches=M)
    plain.load_state_dict(ref.state_dict())
    piped.load_state_dict(ref.state_dict())
    seq = _packed(LENGTHS, E, enforce_sorted)
    hx = (torch.randn(3, len(LENGTHS), H), torch.randn(3, len(LENGTHS), H)) if with_hx else None
    results = []
    for model in (ref, plain, piped):
        x = _leaf(seq)
        h = None if hx is None else tuple(t.clone().requires_grad_() for t in hx)
        out, (h_n, c_n) = model(x, h)
        assert torch.equal(out.batch_sizes, seq.batch_sizes)
        (out.data.sin().sum() + (h_n * 1.5).cos().sum() + c_n.square().sum()).backward()
        results.append((out, h_n, c_n, x.data.grad, None if h is None else [t.grad for t in h]))
    for got in results[1:]:
        for a, b in zip(got[:4], results[0][:4]):
            torch.testing.assert_close(a.data if hasattr(a, "batch_sizes") else a,
                                       b.data if hasattr(b, "batch_sizes") else b, **TOL)
        assert got[0].sorted_indices is seq.sorted_indices or torch.equal(got[0].sorted_indices,
                                                                          seq.sorted_indices)
        if with_hx:
            for a, b in zip(got[4], results[0][4]):
                torch.testing.assert_close(a, b, **TOL)
    _assert_grads(piped, ref)
    _assert_grads(plain, ref)


def _lm(dropout=0.0, layer_norm=False):
    torch.manual_seed(0)
    layers = [nn.Embedding(V, E), pipelstm.LSTM(E, H, num_layers=2), nn.Dropout(dropout)]
    layers += [nn.LayerNorm(H), nn.Tanh()] if layer_norm else []
    return nn.Sequential(*layers, nn.Linear(H, V))


def _unsplit(model, seq, hx=None):
    """The Sequential applied to a PackedSequence layer by layer (per-token layers on its data)."""
    x = seq
    h_n = c_n = None
    for layer in model:
        if isinstance(layer, nn.RNNBase):
            x, (h_n, c_n) = layer(x, hx)
        else:
            x = x._replace(data=layer(x.data))
    return x, h_n, c_n


# units: 0 (Embedding), 1.l0, 1.l1, 2 (Dropout), [LayerNorm, Tanh,] Linear
@pytest.mark.parametrize("balance, K, M, checkpoint", [
    ([2, 3], 1, 1, "never"), ([1, 6], 3, 2, "never"), ([2, 3], 6, 3, "always"), ([3, 2], 20, 7, "except_last"),
])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pipeline_packed_matches_unsplit(balance, K, M, checkpoint, enforce_sorted):
    base = _lm(layer_norm=sum(balance) == 7)
    pipe = pipelstm.Pipeline(copy.deepcopy(base), ["cpu", "cpu"], chunks=K, micro_batches=M, balance=balance,
                             checkpoint=checkpoint)
    seq = _packed(LENGTHS, None, enforce_sorted)
    hx = (torch.randn(2, len(LENGTHS), H), torch.randn(2, len(LENGTHS), H))
    results = []
    for run in (lambda h: pipe(seq, h), lambda h: _unsplit(base, seq, h)):
        h = tuple(t.clone().requires_grad_() for t in hx)
        got = run(h)
        out, h_n, c_n = (got[0], *got[1]) if len(got) == 2 else got
        (out.data.sin().sum() + h_n.cos().sum() + c_n.square().sum()).backward()
        results.append((out, h_n, c_n, h[0].grad, h[1].grad))
    (out, *rest), (ref, *ref_rest) = results
    assert torch.equal(out.batch_sizes, ref.batch_sizes)
    torch.testing.assert_close(out.data, ref.data, **TOL)
    for a, b in zip(rest, ref_rest):
        torch.testing.assert_close(a, b, **TOL)
    _assert_grads(pipe, base)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("K, M", [(1, 1), (3, 2), (20, 7)])
def test_pipeline_packed_loss_matches_unsplit(K, M, reduction):
    base = _lm()
    loss_fn = nn.CrossEntropyLoss(ignore_index=4, reduction=reduction)
    pipe = pipelstm.Pipeline(copy.deepcopy(base), ["cpu", "cpu"], chunks=K, micro_batches=M, loss_fn=loss_fn)
    seq = _packed(LENGTHS, None, enforce_sorted=False)
    target = _packed(LENGTHS, None, enforce_sorted=False, seed=2)
    loss, (h_n, _) = pipe(seq, target=target)
    logits, rh, _ = _unsplit(base, seq)
    ref = loss_fn(logits.data, target.data)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(h_n, rh, **TOL)
    loss.backward()
    ref.backward()
    _assert_grads(pipe, base)
    # the target may also be given as the packed rows themselves
    loss2, _ = pipe(seq, target=target.data)
    torch.testing.assert_close(loss2, ref, **TOL)


def test_pipeline_packed_features_with_dropout_runs_each_token_once():
    # Dropout in training: the pipeline draws its own masks, so compare shapes and that
    # the packed output holds exactly the packed rows (no padding made).
    torch.manual_seed(0)
    model = nn.Sequential(pipelstm.LSTM(E, H, num_layers=2), nn.Dropout(0.5), nn.Linear(H, 3))
    pipe = pipelstm.Pipeline(model, ["cpu", "cpu"], chunks=4, micro_batches=3)
    seq = _packed(LENGTHS, E, enforce_sorted=False)
    out, (h_n, c_n) = pipe(seq)
    assert out.data.shape == (sum(LENGTHS), 3) and h_n.shape == (2, len(LENGTHS), H)
    out.data.sum().backward()


def test_packed_bad_input_is_refused_before_any_work():
    pipe = pipelstm.Pipeline(_lm(), ["cpu", "cpu"], chunks=2, micro_batches=2)
    seq = _packed(LENGTHS, None, enforce_sorted=True)
    with pytest.raises(ValueError, match="data of shape \\[N\\] indices"):
        pipe(seq._replace(data=seq.data[:-1]))
    with pytest.raises(ValueError, match="non-increasing"):
        pipe(seq._replace(batch_sizes=seq.batch_sizes.flip(0)))
    with pytest.raises(ValueError, match="target= exactly when"):
        pipe(seq, target=seq)
    lossy = pipelstm.Pipeline(_lm(), ["cpu", "cpu"], loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="packed differently"):
        lossy(seq, target=_packed(LENGTHS[:-1], None, enforce_sorted=True))
    lstm = pipelstm.LSTM(E, H, num_layers=2, devices=["cpu", "cpu"])
    with pytest.raises(RuntimeError):
        lstm(_packed(LENGTHS, E + 1, enforce_sorted=True))


def test_packed_from_padded_batch_first():
    # pack_padded_sequence of a batch_first LSTM's input: the same as nn.LSTM.
    torch.manual_seed(0)
    ref = nn.LSTM(E, H, num_layers=2, batch_first=True)
    piped = pipelstm.LSTM(E, H, num_layers=2, batch_first=True, devices=["cpu", "cpu"], chunks=3, micro_batches=2)
    piped.load_state_dict(ref.state_dict())
    x = torch.randn(len(LENGTHS), max(LENGTHS), E)
    seq = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=True, enforce_sorted=False)
    (a, (ha, ca)), (b, (hb, cb)) = piped(seq), ref(seq)
    for u, v in ((a.data, b.data), (ha, hb), (ca, cb)):
        torch.testing.assert_close(u, v, **TOL)
