"""A pipelined step in torch.profiler's trace: every stage's pass, work item
(micro-batch, chunk), unit, hand-over and parameter-gradient task is a
range (csrc/pipeline/profile_range.h), recorded on the stage's thread."""

import itertools

import torch
from torch.profiler import ProfilerActivity, profile

import pipelstm

from pipeline_models import lm_model

K, M = 2, 3


def _profiled_step(checkpoint: str = "never"):
    torch.manual_seed(0)
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], chunks=K, micro_batches=M, balance=[3, 3],
                             checkpoint=checkpoint)
    x = torch.randint(0, 37, (6, 5))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out, _ = pipe(x)
        out.sum().backward()
    return pipe, prof.events()


def _unit_labels(stage: int):
    """The pipeline's units on `stage`, as the ranges name them."""
    first = sum(len(units) for units in _plan_units()[:stage])
    return [f"unit {first + j} '{name}' ({kind})" for j, (name, kind) in enumerate(_plan_units()[stage])]


def _plan_units():
    # lm_model's units over balance [3, 3]: Embedding, then the LSTM's three
    # layers on stage 0; Dropout, Linear on stage 1 (see tests/pipeline_models.py).
    return [[("0", "Embedding"), ("1.l0", "LSTM layer"), ("1.l1", "LSTM layer")],
            [("1.l2", "LSTM layer"), ("2", "Dropout"), ("3", "Linear")]]


def test_every_stage_item_and_unit_has_its_ranges():
    pipe, events = _profiled_step()
    names = {e.name for e in events}
    for s in range(2):
        assert f"pipelstm forward stage {s}" in names
        assert f"pipelstm backward stage {s}" in names
        for m, k in itertools.product(range(M), range(K)):
            item = f"micro-batch {m} chunk {k}"
            assert f"pipelstm forward stage {s} {item}" in names
            assert f"pipelstm backward stage {s} {item}" in names
            for unit in _unit_labels(s):
                assert f"pipelstm forward stage {s} {unit} {item}" in names
                assert f"pipelstm backward stage {s} {unit} {item}" in names
        # Stage 0 hands every item to stage 1 forward, and stage 1 back.
        assert {f"pipelstm transfer stage {s} micro-batch {m} chunk {k}"
                for m, k in itertools.product(range(M), range(K))} <= names
    # Every unit with parameters has its gradient task, on one stage or
    # the other (a stage that finishes first takes its neighbour's).
    weights = {n.split(" stage ")[1].split(" ", 1)[1] for n in names if n.startswith("pipelstm weights stage ")}
    with_params = [u for s in range(2) for u in _unit_labels(s) if "Dropout" not in u]
    assert weights == set(with_params)


def test_ranges_run_on_the_stage_threads_around_the_kernels():
    _, events = _profiled_step()
    caller = {e.thread for e in events if e.name == "_PipelineFunction"}
    stage_threads = [{e.thread for e in events if e.name.startswith(f"pipelstm forward stage {s}")}
                     for s in range(2)]
    assert all(len(t) == 1 for t in stage_threads)
    assert stage_threads[0] != stage_threads[1] and not (stage_threads[0] | stage_threads[1]) & caller
    # A unit's range holds the ops it ran.
    lstm = [e for e in events if e.name.startswith("pipelstm forward stage 0 unit 1 ")]
    assert len(lstm) == K * M
    assert all(any(c.name.startswith(("pipelstm::", "aten::")) for c in e.cpu_children) for e in lstm)


def test_recomputed_items_have_their_range():
    _, events = _profiled_step(checkpoint="always")
    names = {e.name for e in events}
    for s, (m, k) in itertools.product(range(2), itertools.product(range(M), range(K))):
        assert f"pipelstm recompute stage {s} micro-batch {m} chunk {k}" in names
