"""pipelstm/pipeline/placement.py: the stages' devices and thread budgets,
and the parameters placed on them."""

import os

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.pipeline.placement import cap_threads, place, thread_budgets
from pipelstm.pipeline.units import flatten

from pipeline_models import lm_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(devices=["cpu"] * 7), "7 stages but only 6 units"),
        (dict(devices=["cpu", "nosuchdevice"]), "unknown device"),
        (dict(devices=["cpu", "cuda:7"]), "cuda:7"),
        (dict(devices=[]), "non-empty list"),
        (dict(devices=["cpu", "cpu"], threads=0), r"threads\[0\] = 0 for the CPU stage 0: expected 1 to"),
        (dict(devices=["cpu", "cpu"], threads=[1, -2]), r"threads\[1\] = -2 for the CPU stage 1: expected 1 to"),
        (dict(devices=["cpu"], threads=10**6), r"threads\[0\] = 1000000 .* expected 1 to \d+ \(this machine's CPUs\)"),
        (dict(devices=["cpu", "cpu"], threads=[1]), r"threads \[1\] must give one count per stage \(2\)"),
    ],
)
def test_invalid_devices_and_threads_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipelstm.Pipeline(lm_model(), **kwargs)


@pytest.mark.parametrize("threads", [2.5, "2", [1, True]])
def test_threads_of_the_wrong_type_are_rejected(threads):
    with pytest.raises(TypeError, match=r"Pipeline: threads(\[1\])? must be"):
        pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], threads=threads)


def test_thread_budgets_share_the_callers_threads_among_the_cpu_stages():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert thread_budgets(None, [cpu, cpu]) == [1, 1]  # at least one each
        assert thread_budgets(None, [cpu, meta]) == [1, 0]  # accelerators get none
        assert thread_budgets(1, [cpu, meta]) == [1, 0]
    finally:
        torch.set_num_threads(before)


def test_cap_threads_to_this_machine():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert cap_threads([10**6, 0, 3], [cpu, cpu, meta]) == [os.cpu_count(), 1, 3]


@pytest.mark.parametrize("second", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_place_moves_the_same_parameters(second):
    model = nn.Sequential(nn.Linear(3, 4), nn.LSTM(4, 5, num_layers=2))
    units = flatten(model.named_children())
    params = list(model.parameters())
    place(units, [2, 1], [torch.device("cpu"), torch.device(second)])
    assert [u.device.type for u in units] == ["cpu", "cpu", second]
    assert all(p is q for p, q in zip(model.parameters(), params))  # moved in place: an optimizer keeps them
    assert model[0].weight.device.type == "cpu" and model[1].weight_ih_l0.device.type == "cpu"
    assert model[1].weight_ih_l1.device.type == second and model[1].bias_hh_l1.device.type == second


@pytest.mark.parametrize("devices, message", [
    (["cpu", "nosuchdevice"], "unknown device"),
    (["cpu", "cuda:7"], "cuda:7"),
    (["cpu", "meta"], "unsupported device"),
])
def test_device_errors_name_the_class_the_user_called(devices, message):
    # LSTM(devices=) builds a pipeline inside: its errors still begin "LSTM:".
    with pytest.raises(ValueError, match=rf"^LSTM: .*{message}"):
        pipelstm.LSTM(3, 4, num_layers=2, devices=devices)
    with pytest.raises(ValueError, match=rf"^Pipeline: .*{message}"):
        pipelstm.Pipeline(lm_model(), devices=devices)
