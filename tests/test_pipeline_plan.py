"""pipelstm/pipeline/plan.py: the stages as a table (``Pipeline.plan``)."""

import copy

import torch
from torch import nn

import pipelstm
from pipelstm.pipeline.plan import format_bytes


def test_plan_table():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4), pipelstm.LSTM(4, 64), pipelstm.LSTM(64, 64), nn.Linear(64, 3))
    pipe = pipelstm.Pipeline(model, devices=["cpu", "cpu"])  # FLOP cost model
    text = str(pipe.plan)
    for column in ("stage", "device", "units", "est.", "params", "activations"):
        assert column in text
    assert "1.l0" in text and "2.l0" in text
    sample = torch.randint(0, 20, (6, 3))
    profiled = pipelstm.Pipeline(copy.deepcopy(model), devices=["cpu", "cpu"], sample=sample)
    assert "ms" in str(profiled.plan)


def test_plan_rows_sum_their_stages_units():
    model = nn.Sequential(nn.Embedding(20, 4), pipelstm.LSTM(4, 8, num_layers=2), nn.Linear(8, 3))
    pipe = pipelstm.Pipeline(model, devices=["cpu", "cpu"], balance=[1, 3], threads=1)
    plan = pipe.plan
    assert plan.per_token and plan.unit_label == "MFLOP/token"
    assert [r["units"] for r in plan.rows] == [["0"], ["1.l0", "1.l1", "2"]]
    assert [r["params"] for r in plan.rows] == [80, sum(p.numel() for p in model[1:].parameters())]
    assert [r["threads"] for r in plan.rows] == [1, 1] and [r["device"] for r in plan.rows] == ["cpu", "cpu"]
    units = pipe.core.units
    assert plan.rows[1]["est"] == sum(u.cost for u in units[1:])
    assert plan.rows[1]["act_bytes"] == sum(u.act_bytes for u in units[1:])
    assert str(plan) == repr(plan) and len(str(plan).splitlines()) == 2 + 2


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 2**20, 3 * 2**30, 2**50)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB", "3.0 GiB", f"{2**20:.1f} GiB"]
