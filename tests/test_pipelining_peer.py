"""pipelstm.bench.pipelining_peer: the torch.distributed.pipelining peer benchmark.

The split stages run one after the other in one process compute the unsplit
model's loss (and gradients), so the peer measures the same model; the
2-process gloo measurement returns a positive finite time for both schedules.
"""

import copy
import math

import pytest
import torch
import torch.distributed as dist

from pipelstm.bench import pipelining_peer as peer

QUICK = peer.SIZES[True]


def _gloo_available() -> bool:
    return dist.is_available() and dist.is_gloo_available()


def _model_and_data(seed=0):
    torch.manual_seed(seed)
    model = peer.LanguageModel(QUICK["vocab"], QUICK["emb"], QUICK["hidden"], QUICK["layers"])
    x, target = peer.make_data(QUICK["vocab"], QUICK["T"], QUICK["B"], seed)
    return model, x, target


def test_balanced_split():
    assert peer.balanced_split(**{k: QUICK[k] for k in ("vocab", "emb", "hidden", "layers")}) == 2
    full = peer.SIZES[False]
    assert peer.balanced_split(**{k: full[k] for k in ("vocab", "emb", "hidden", "layers")}) == 3


@pytest.mark.parametrize("k", [1, 2, 3])
def test_split_stages_equal_unsplit_model(k):
    model, x, target = _model_and_data()
    s0, s1 = peer.split_model(copy.deepcopy(model), k)
    assert s0.lstm.num_layers == k and s1.lstm.num_layers == QUICK["layers"] - k

    ref = peer.loss_fn(model(x), target)
    ref.backward()
    loss = peer.loss_fn(s1(s0(x)), target)
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)

    # the same gradients, parameter by parameter (LSTM layers renumbered per stage)
    torch.testing.assert_close(s0.embedding.weight.grad, model.embedding.weight.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(s1.decoder.weight.grad, model.decoder.weight.grad, rtol=1e-5, atol=1e-7)
    for layer in range(QUICK["layers"]):
        sub, i = (s0.lstm, layer) if layer < k else (s1.lstm, layer - k)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            torch.testing.assert_close(getattr(sub, f"{name}_l{i}").grad,
                                       getattr(model.lstm, f"{name}_l{layer}").grad, rtol=1e-5, atol=1e-7)


def test_micro_batch_losses_average_to_full_batch_loss():
    """As the schedules chunk them: input along dim 1, target along dim 0; the mean of the
    equal-sized micro-batch losses (scale_grads=True) is the full-batch loss."""
    model, x, target = _model_and_data()
    with torch.no_grad():
        full = peer.loss_fn(model(x), target)
        parts = [peer.loss_fn(model(xc), tc) for xc, tc in zip(x.tensor_split(4, dim=1), target.tensor_split(4, dim=0))]
    torch.testing.assert_close(torch.stack(parts).mean(), full, rtol=1e-5, atol=0)


@pytest.mark.parametrize("schedule, micro_batches", [("gpipe", 3), ("1f1b", 1), ("nope", 2)])
def test_bad_arguments_raise_before_spawning(schedule, micro_batches):
    with pytest.raises(ValueError):
        peer.time_pipelining(schedule, micro_batches, quick=True, reps=1)


@pytest.mark.skipif(not _gloo_available(), reason="torch.distributed or its gloo backend is not available")
@pytest.mark.parametrize("schedule, micro_batches", [("gpipe", 2), ("1f1b", 4)])
def test_time_pipelining(schedule, micro_batches):
    seconds = peer.time_pipelining(schedule, micro_batches, quick=True, reps=1)
    assert isinstance(seconds, float)
    assert math.isfinite(seconds) and seconds > 0
