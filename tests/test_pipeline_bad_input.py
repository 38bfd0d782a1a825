"""Bad input to a pipeline fails at its entry, before any work, naming the
argument and what was expected (PipelineCore.check_input, check_states,
check_target: one check that Pipeline, LSTM(devices=) and PipelineParallel
share), not deep inside a stage (e.g. blaming an LSTM layer's `w_ih` for
the input's feature size)."""

import pytest
import torch
from torch import nn

import pipelstm
from distributed_utils import one_process_mesh

V, E, H = 10, 4, 6


def lm(batch_first=False):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(V, E), pipelstm.LSTM(E, H, 2, batch_first=batch_first), nn.Linear(H, V))


def features(batch_first=False):
    torch.manual_seed(0)
    return nn.Sequential(nn.Dropout(0.1), pipelstm.LSTM(E, H, 2, batch_first=batch_first), nn.Linear(H, V))


def zeros(*shape, **kw):
    return torch.zeros(*shape, **kw)


# model, batch_first, (input, hx), exception, message
CASES = {
    "feature size": (features, False, (zeros(5, 3, E + 1),), RuntimeError,
                     r"^Pipeline: expected input of shape \[T, B, I\] features with I=4 \(the input size of the "
                     r"first unit, '1\.l0'\), got \[5, 3, 5\]$"),
    "feature size, batch_first": (features, True, (zeros(3, 5, E + 1),), RuntimeError,
                                  r"shape \[B, T, I\] features with I=4 .*got \[3, 5, 5\]$"),
    "feature dtype": (features, False, (zeros(5, 3, E, dtype=torch.float64),), ValueError,
                      r"^Pipeline: expected input of dtype torch.float32 \(that of the first unit, '1\.l0'\), got "
                      r"torch.float64; convert it"),
    "integer features": (features, False, (zeros(5, 3, E, dtype=torch.int64),), ValueError,
                         r"expected input of dtype torch.float32 .* got torch.int64"),
    "2-D features": (features, False, (zeros(5, 3),), ValueError,
                     r"^Pipeline: expected input of shape \[T, B, I\] features, got a 2-D tensor of shape \[5, 3\]$"),
    "4-D features": (features, False, (zeros(5, 3, E, 1),), ValueError, r"got a 4-D tensor"),
    "float indices": (lm, False, (zeros(5, 3),), ValueError,
                      r"^Pipeline: the first unit, '0', is an Embedding: expected input of integer indices "
                      r"\(torch.int64 or torch.int32\), got torch.float32$"),
    "3-D indices": (lm, False, (zeros(5, 3, 1, dtype=torch.int64),), ValueError,
                    r"^Pipeline: expected input of shape \[T, B\] indices, got a 3-D tensor of shape \[5, 3, 1\]$"),
    "not a tensor": (lm, False, ([[1, 2]],), ValueError, r"expected input of shape \[T, B\] indices, got list"),
    "meta": (lm, False, (zeros(5, 3, dtype=torch.int64, device="meta"),), RuntimeError,
             r"^Pipeline: the input is on meta, but the first pipeline stage runs on cpu"),
    "h_0 batch": (lm, False, (zeros(5, 3, dtype=torch.int64), (zeros(2, 4, H), zeros(2, 3, H))), RuntimeError,
                  r"^Pipeline: expected h_0\[0\] of shape \[3, 6\] \(batch 3, LSTM layer '1\.l0'\), got \[4, 6\]$"),
    "c_0 width": (lm, False, (zeros(5, 3, dtype=torch.int64), (zeros(2, 3, H), zeros(2, 3, H + 1))), RuntimeError,
                  r"expected c_0\[0\] of shape \[3, 6\]"),
    "h_0 dtype": (lm, False, (zeros(5, 3, dtype=torch.int64), (zeros(2, 3, H).double(), zeros(2, 3, H))),
                  RuntimeError, r"expected h_0\[0\] of dtype torch.float32 \(that of LSTM layer '1\.l0'\), got "
                                r"torch.float64"),
    "h_0 batch, batch_first": (lm, True, (zeros(3, 5, dtype=torch.int64), (zeros(2, 4, H), zeros(2, 3, H))),
                               RuntimeError, r"expected h_0\[0\] of shape \[3, 6\] \(batch 3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pipeline_checks_its_input_at_the_entry(case):
    model, batch_first, args, error, message = CASES[case]
    pipe = pipelstm.Pipeline(model(batch_first), ["cpu", "cpu"], chunks=2, micro_batches=2, threads=1)
    with pytest.raises(error, match=message):
        pipe(*args)
    assert pipe.trace() == []  # no stage ran


def test_the_same_input_runs():
    # The checks let through what the engine takes: int32 indices, batch_first, states anywhere.
    pipe = pipelstm.Pipeline(lm(True), ["cpu", "cpu"], chunks=2, micro_batches=2, threads=1)
    out, _ = pipe(torch.randint(0, V, (3, 5), dtype=torch.int32), (zeros(2, 3, H), zeros(2, 3, H)))
    assert out.shape == (3, 5, V)


def test_a_target_of_another_shape_is_refused_before_any_work():
    pipe = pipelstm.Pipeline(lm(True), ["cpu", "cpu"], threads=1, loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(RuntimeError, match=r"^Pipeline: expected target of shape \[3, 5\] \(the input's\), got "
                                           r"\[3, 4\]$"):
        pipe(torch.randint(0, V, (3, 5)), target=torch.zeros(3, 4, dtype=torch.long))
    assert pipe.trace() == []


def test_lstm_with_devices_checks_with_nn_lstms_messages_then_the_stage_device():
    lstm = pipelstm.LSTM(E, H, 2, devices=["cpu", "cpu"], threads=1)
    with pytest.raises(RuntimeError, match=r"input.size\(-1\) must be equal to input_size. Expected 4, got 5"):
        lstm(zeros(5, 3, E + 1))
    with pytest.raises(RuntimeError, match=r"^LSTM: the input is on meta, but the first pipeline stage runs on cpu"):
        lstm(zeros(5, 3, E, device="meta"))


@pytest.mark.parametrize("args, error, message", [
    ((zeros(5, 3, E + 1),), RuntimeError, r"^PipelineParallel: expected input of shape \[T, B, I\] features with I=4"),
    ((zeros(5, 3, E, dtype=torch.float64),), ValueError, r"^PipelineParallel: expected input of dtype torch.float32"),
    ((zeros(5, 3, E), zeros(5, 4, dtype=torch.long)), RuntimeError,
     r"^PipelineParallel: expected target of shape \[5, 3\] \(the input's\), got \[5, 4\]"),
    ((zeros(5, 3, E), zeros(5, 3)), ValueError, r"^PipelineParallel: expected target of dtype torch.int64"),
    ((zeros(5, 3, E),), ValueError, r"^PipelineParallel: pass target= exactly when"),
], ids=["feature size", "dtype", "target shape", "target dtype", "no target"])
def test_pipeline_parallel_checks_its_input_at_the_entry(tmp_path, args, error, message):
    import pipelstm.distributed as pdist

    with one_process_mesh(tmp_path, pp=1, timeout=60) as mesh:
        pipe = pdist.PipelineParallel(features(), mesh, chunks=2, threads=1, loss_fn=nn.CrossEntropyLoss())
        with pytest.raises(error, match=message):
            pipe(*args)
        assert pipe.core.trace() == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_reduced_precision_lstm_on_the_cpu_is_refused(dtype):
    # The ops compute it in float32 on the CPU; a pipeline's split backward
    # would round the gate gradients first, so it refuses rather than differ.
    torch.manual_seed(0)
    model = nn.Sequential(pipelstm.LSTM(E, H, 2), nn.Linear(H, V)).to(dtype)
    pipe = pipelstm.Pipeline(model, ["cpu", "cpu"], chunks=2)
    with pytest.raises(RuntimeError, match=r"LSTM layer.* on the CPU runs float32 or float64, got BFloat16|"
                                           r"LSTM layer.* on the CPU runs float32 or float64, got Half"):
        pipe(torch.zeros(5, 3, E, dtype=dtype))
