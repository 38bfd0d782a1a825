"""The schedule (csrc/pipeline/schedule.h): the order in which every stage
runs its work items, read back from the trace the engine records."""

import pytest
import torch
from torch import nn

import pipelstm


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Embedding(23, 8), nn.LSTM(8, 12, num_layers=3), nn.Linear(12, 23))


def _order(trace, stage: int, phase: str):
    spans = sorted((e["start_ns"], e["micro_batch"], e["chunk"]) for e in trace
                   if e["stage"] == stage and e["phase"] == phase)
    return [(m, k) for _, m, k in spans]


@pytest.mark.parametrize("K, M, stages", [(3, 2, 2), (2, 3, 3), (1, 4, 2), (4, 1, 1)])
def test_every_stage_runs_its_items_in_the_documented_order(K, M, stages):
    torch.manual_seed(0)
    pipe = pipelstm.Pipeline(_model(), devices=["cpu"] * stages, chunks=K, micro_batches=M, threads=1)
    out, _ = pipe(torch.randint(0, 23, (8, 6)))
    out.sum().backward()
    trace = pipe.trace()
    forward = [(m, k) for k in range(K) for m in range(M)]
    for s in range(stages):
        assert _order(trace, s, "forward") == forward, f"stage {s} forward"
        assert _order(trace, s, "backward") == forward[::-1], f"stage {s} backward"
