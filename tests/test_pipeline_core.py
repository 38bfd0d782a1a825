"""pipelstm/pipeline/core.py: PipelineCore on its own, as Pipeline,
LSTM(devices=) and PipelineParallel's stage hold it."""

import copy
import gc
import io
import os
import pickle

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.pipeline import PipelineCore
from pipelstm.pipeline.balance import estimate_costs
from pipelstm.pipeline.units import flatten, loss_spec

from pipeline_models import lm_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(devices=["cpu"], chunks=0), "chunks must be a positive int"),
        (dict(devices=["cpu"], micro_batches=-1), "micro_batches must be a positive int"),
    ],
)
def test_invalid_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipelstm.Pipeline(lm_model(), **kwargs)


def make_core(model, balance=(2, 4), **kw):
    units = flatten(model.named_children())
    estimate_costs(units)
    return PipelineCore(units, [torch.device("cpu")] * len(balance), list(balance), 1, chunks=3, micro_batches=2,
                        **kw)


def test_settings_are_checked_with_the_callers_name():
    with pytest.raises(ValueError, match=r"^X: checkpoint must be one of 'never', 'except_last', 'always'"):
        make_core(lm_model(), checkpoint="sometimes", who="X")
    with pytest.raises(ValueError, match=r"^X: balance \[2, 2\] sums to 4"):
        make_core(lm_model(), balance=(2, 2), who="X")


def test_run_equals_the_pipeline_and_without_grad_keeps_nothing():
    torch.manual_seed(0)
    model = lm_model().eval()
    pipe = pipelstm.Pipeline(copy.deepcopy(model), devices=["cpu", "cpu"], balance=[2, 4], chunks=3, micro_batches=2,
                             threads=1)
    core = make_core(model)
    assert core.num_layers == 3 and [u.name for s in core.stage_specs() for u in s.units] == [
        "0", "1.l0", "1.l1", "1.l2", "2", "3"]
    x = torch.randint(0, 37, (7, 4))
    with torch.no_grad():
        out, h_n, c_n = core.run(x, [None] * 3, [None] * 3, training=False)
        expected, (h, c) = pipe(x)
    assert not out.requires_grad and core.saved_activation_bytes == 0
    assert torch.equal(out, expected) and torch.equal(torch.stack(h_n), h) and torch.equal(torch.stack(c_n), c)
    out, _, _ = core.run(x, [None] * 3, [None] * 3, training=False)  # with grad: the engine keeps activations
    assert out.requires_grad and core.saved_activation_bytes > 0
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert {e["stage"] for e in core.trace()} == {0, 1}


def _live_pass_nodes() -> int:
    gc.collect()
    return sum(type(o).__name__ == "_PipelineFunctionBackward" for o in gc.get_objects())


@pytest.mark.parametrize("backward", [True, False], ids=["forward+backward", "forward only"])
def test_a_pass_is_freed_with_its_outputs(backward):
    # The autograd node of a pass holds the engine's run; a run that kept its
    # outputs was reachable from them, a cycle through C++ that no garbage
    # collection frees: one pass (and, without backward, all it saved) per step.
    core = make_core(lm_model())
    x = torch.randint(0, 37, (7, 4))
    before = _live_pass_nodes()
    for _ in range(3):
        out, h_n, c_n = core.run(x, [None] * 3, [None] * 3, training=True)
        assert core.saved_activation_bytes > 0
        if backward:
            out.sum().backward()
        del out, h_n, c_n
    assert _live_pass_nodes() == before


def test_a_loss_unit_ends_the_last_stage():
    core = make_core(lm_model(), loss=loss_spec(nn.CrossEntropyLoss()))
    assert [u.name for u in core.stage_specs()[-1].units][-1] == "loss"
    x, y = torch.randint(0, 37, (5, 2)), torch.randint(0, 5, (5, 2))
    loss, _, _ = core.run(x, [None] * 3, [None] * 3, training=False, target=y)
    assert loss.dim() == 0


@pytest.mark.parametrize("how", ["pickle", "torch.save", "deepcopy"])
def test_a_core_round_trips_with_a_new_engine(how):
    torch.manual_seed(0)
    model = lm_model().eval()
    core = make_core(model, checkpoint="always")
    core.threads = [10**6, 1]  # saved on a machine with more CPUs
    if how == "pickle":
        twin = pickle.loads(pickle.dumps(core))
    elif how == "torch.save":
        buf = io.BytesIO()
        torch.save(core, buf)
        buf.seek(0)
        with torch.serialization.safe_globals([nn.Embedding, nn.Dropout, nn.Linear]):  # the user's torch.nn
            twin = torch.load(buf)  # weights_only: the core and its units are pipelstm's safe globals
    else:
        twin = copy.deepcopy(core)
    assert twin.engine is not core.engine
    assert twin.threads == [os.cpu_count(), 1]
    assert (twin.balance, twin.chunks, twin.micro_batches, twin.checkpoint) == ([2, 4], 3, 2, "always")
    assert [u.name for u in twin.units] == [u.name for u in core.units]
    assert all(u.module is not v.module for u, v in zip(twin.units, core.units))  # its own modules
    x = torch.randint(0, 37, (6, 2))
    with torch.no_grad():
        core.threads = [1, 1]
        assert torch.equal(twin.run(x, [None] * 3, [None] * 3, False)[0], core.run(x, [None] * 3, [None] * 3, False)[0])
