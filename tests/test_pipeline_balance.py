"""pipelstm/pipeline/balance.py: the units' costs and their split into stages."""

import copy

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.pipeline import partition
from pipelstm.pipeline.balance import estimate_costs, resolve_balance
from pipelstm.pipeline.units import flatten

from pipeline_models import lm_model


def test_partition_minimises_the_slowest_stage():
    assert partition([1, 1, 1, 1], 2) == [2, 2]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [5, 2, 2]  # 15 | 13 | 17 -> max 17
    assert partition([3, 3, 3], 3) == [1, 1, 1]
    with pytest.raises(ValueError):
        partition([1, 2], 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(devices=["cpu", "cpu"], balance=[2, 3]), "sums to 5"),
        (dict(devices=["cpu", "cpu"], balance=[6]), "each of the 2 stages"),
        (dict(devices=["cpu", "cpu"], balance=[0, 6]), "each of the 2 stages"),
        (dict(devices=["cpu"], balance="fast"), "balance must be"),
    ],
)
def test_invalid_balance_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipelstm.Pipeline(lm_model(), **kwargs)


def test_auto_balance_by_the_cost_model_and_by_profiling():
    torch.manual_seed(0)
    # Two big layers and small neighbours: each big layer gets its own stage.
    model = nn.Sequential(nn.Embedding(20, 4), pipelstm.LSTM(4, 64), pipelstm.LSTM(64, 64), nn.Linear(64, 3))
    pipe = pipelstm.Pipeline(model, devices=["cpu", "cpu"])  # FLOP cost model
    assert pipe.balance == [2, 2]
    sample = torch.randint(0, 20, (6, 3))
    profiled = pipelstm.Pipeline(copy.deepcopy(model), devices=["cpu", "cpu"], sample=sample)
    assert sum(profiled.balance) == 4 and len(profiled.balance) == 2
    out, _ = profiled(sample)
    assert out.shape == (6, 3, 3)


def test_estimate_costs_per_token_or_for_the_sample():
    model = nn.Sequential(nn.Embedding(20, 4), nn.LSTM(4, 8), nn.Linear(8, 3))
    units = flatten(model.named_children())
    assert estimate_costs(units) is None  # the cost model: FLOPs and bytes per token
    per_token = [(u.cost, u.act_bytes) for u in units]
    assert per_token == [u.cost_per_token() for u in units]
    sample = torch.randint(0, 20, (5, 2))
    assert estimate_costs(units, sample) == (5, 2)  # profiled: seconds, bytes for the sample's 10 tokens
    assert all(u.cost > 0 for u in units)
    assert [u.act_bytes for u in units] == [b * 10 for _, b in per_token]
    assert all(p.grad is None for p in model.parameters())  # the profiler leaves no gradients behind


def test_resolve_balance_names_the_caller():
    units = flatten(lm_model().named_children())
    estimate_costs(units)
    assert resolve_balance("auto", units, 2, "X") == partition([u.cost for u in units], 2)
    with pytest.raises(ValueError, match=r"^X: balance \[1\] sums to 1, but the model has 6 units \(0, 1.l0"):
        resolve_balance([1], units, 1, "X")
