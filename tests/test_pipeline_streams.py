"""Streams, events and the courier (csrc/pipeline/streams.h), run on the CPU
through their stand-in: with PIPELSTM_HOST_COPY_STREAM set, every hand-over
between CPU stages is copied by a thread of the sending stage's own, late and
into NaN-filled memory, so a consumer that does not wait for the copy's
event reads NaN."""

import pytest
import torch
from torch import nn

import pipelstm

DELAY_US = "20000"  # far longer than any stage's compute of one item here


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(23, 8), nn.LSTM(8, 12, num_layers=3), nn.Linear(12, 23)).double()


def _run(pipe, tokens):
    pipe.zero_grad()
    out, _ = pipe(tokens)
    out.pow(2).sum().backward()
    return out.detach(), [p.grad.clone() for p in pipe.parameters()], pipe.trace()


def _transfers(trace):
    return sum(1 for e in trace if e["phase"] == "transfer")


@pytest.mark.parametrize("stages, K, M", [(2, 3, 2), (3, 2, 3)])
def test_host_copy_stream_gives_the_plain_run_bitwise(monkeypatch, stages, K, M):
    monkeypatch.delenv("PIPELSTM_HOST_COPY_STREAM", raising=False)  # `make test` runs with it too
    tokens = torch.randint(0, 23, (6, 8), generator=torch.Generator().manual_seed(1))
    pipe = pipelstm.Pipeline(_model(), devices=["cpu"] * stages, chunks=K, micro_batches=M, threads=1)
    out, grads, trace = _run(pipe, tokens)
    assert _transfers(trace) == 0  # between CPU stages nothing is copied by default

    monkeypatch.setenv("PIPELSTM_HOST_COPY_STREAM", DELAY_US)
    out_c, grads_c, trace_c = _run(pipe, tokens)
    # Every stage hands every item on through the courier, the last ones to
    # the assembled result; backward, all but stage 0 (token ids have no
    # gradient).
    assert _transfers(trace_c) == (2 * stages - 1) * K * M
    assert not out_c.isnan().any()
    assert torch.equal(out_c, out)
    for g_c, g in zip(grads_c, grads):
        assert torch.equal(g_c, g)

    # And both are the unsplit model's.
    ref = _model()
    ref_out, _ = ref[1](ref[0](tokens))
    ref_out = ref[2](ref_out)
    ref_out.pow(2).sum().backward()
    torch.testing.assert_close(out_c, ref_out.detach())
    for g_c, p in zip(grads_c, ref.parameters()):
        torch.testing.assert_close(g_c, p.grad)


def test_host_copy_stream_serves_lstm_devices(monkeypatch):
    monkeypatch.delenv("PIPELSTM_HOST_COPY_STREAM", raising=False)
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(6, 10, num_layers=2, devices=["cpu", "cpu"], chunks=2, micro_batches=2).double()
    x = torch.randn(7, 4, 6, dtype=torch.float64)
    out, (h, c) = lstm(x)
    monkeypatch.setenv("PIPELSTM_HOST_COPY_STREAM", DELAY_US)
    out_c, (h_c, c_c) = lstm(x)
    assert torch.equal(out_c, out) and torch.equal(h_c, h) and torch.equal(c_c, c)


def test_a_bad_host_copy_stream_setting_is_named(monkeypatch):
    pipe = pipelstm.Pipeline(_model(), devices=["cpu", "cpu"], chunks=2, threads=1)
    monkeypatch.setenv("PIPELSTM_HOST_COPY_STREAM", "soon")
    with pytest.raises(RuntimeError, match="PIPELSTM_HOST_COPY_STREAM=soon is not a number of microseconds"):
        pipe(torch.randint(0, 23, (4, 2)))
