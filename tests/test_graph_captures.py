"""csrc/graph_captures.h: which of a graph key's captures a call replays.

A CUDA graph writes its outputs into the same buffers at every replay; the
layer ops hand those buffers out without copying them, so a capture may be
replayed only once nothing holds what it handed out. Here the choice runs
over a CPU stand-in for a graph (csrc/graph_stand_in.cpp), whose replay
runs the body again and writes over its capture's outputs as a graph's
would: every result a caller still holds must keep its values whatever the
later calls replay. (The CUDA runner, cuda/graph_replay_cuda.cpp, is
checked on a GPU by tests/gpu/test_gpu_graphs.py.)
"""

import pytest
import torch

from pipelstm import _C

OPS = torch.ops.pipelstm


def _body(inputs):
    x, = inputs
    return [x * 2, x.sum().reshape(1)]


def _expected(x):
    return _body([x])


def _assert_results(got, x):
    for a, e in zip(got, _expected(x)):
        assert torch.equal(a, e)


def _calls(n, size=5):
    return [torch.full((size,), float(k + 1)) for k in range(n)]


def test_nothing_held_one_capture_whose_outputs_are_handed_out():
    captures = _C._StandInGraphCaptures()
    addresses = []
    for k, x in enumerate(_calls(4)):
        got, captured = captures.run([x], _body)
        assert captured == (k == 0)
        _assert_results(got, x)
        addresses.append([t.data_ptr() for t in got])
        del got
    assert all(a == addresses[0] for a in addresses)  # the capture's own buffers, not copies


def test_last_results_held_at_the_next_call_alternate_two_captures():
    captures = _C._StandInGraphCaptures()
    made, out = [], None
    for x in _calls(6):
        previous = out  # what `out = lstm(x)` still holds while the call runs
        out, captured = captures.run([x], _body)
        made.append(captured)
        _assert_results(out, x)
        if previous is not None:
            assert out[0].data_ptr() != previous[0].data_ptr()
        del previous
    assert made == [True, True, False, False, False, False]


def test_every_result_held_keeps_its_values():
    # Two captures lend; once both are out a third hands out copies.
    captures = _C._StandInGraphCaptures()
    xs = _calls(6)
    kept = []
    made = []
    for x in xs:
        got, captured = captures.run([x], _body)
        kept.append(got)
        made.append(captured)
    assert made == [True, True, True, False, False, False]
    for got, x in zip(kept, xs):
        _assert_results(got, x)
    assert len({got[0].data_ptr() for got in kept}) == len(kept)  # the copying capture's are copies


def test_a_result_saved_for_a_backward_is_held():
    captures = _C._StandInGraphCaptures()
    w = torch.ones(5, requires_grad=True)
    x1, x2 = _calls(2)
    got, _ = captures.run([x1], _body)
    loss = (w * got[0]).sum()  # saves got[0] for the backward
    del got
    got2, captured = captures.run([x2], _body)
    assert captured  # the first capture's outputs are still saved
    loss.backward()
    assert torch.equal(w.grad, _expected(x1)[0])
    del loss, got2
    _, captured = captures.run([x1], _body)
    assert not captured


def test_a_failed_capture_leaves_the_captures_as_they_were():
    captures = _C._StandInGraphCaptures()
    x1, x2 = _calls(2)
    kept, _ = captures.run([x1], _body)

    def failing(inputs):
        raise RuntimeError("cannot capture")

    with pytest.raises(RuntimeError, match="cannot capture"):
        captures.run([x2], failing)
    got, captured = captures.run([x2], _body)
    assert captured
    _assert_results(got, x2)
    _assert_results(kept, x1)


def test_a_capture_whose_first_replay_fails_is_not_kept():
    captures = _C._StandInGraphCaptures()
    x1, x2 = _calls(2)
    runs = []

    def fails_on_replay(inputs):
        runs.append(1)
        if len(runs) > 1:  # the capture ran it once; this is the replay
            raise RuntimeError("replay failed")
        return _body(inputs)

    with pytest.raises(RuntimeError, match="replay failed"):
        captures.run([x1], fails_on_replay)
    got, captured = captures.run([x2], _body)
    assert captured  # a capture of its own, not the failed one
    _assert_results(got, x2)


def test_without_further_captures_a_call_that_needs_one_is_refused():
    captures = _C._StandInGraphCaptures()
    x1, x2 = _calls(2)
    kept, _ = captures.run([x1], _body)
    assert captures.run([x2], _body, may_capture=False) is None  # the one capture's outputs are held
    del kept
    got, captured = captures.run([x2], _body, may_capture=False)
    assert not captured
    _assert_results(got, x2)


def test_lstm_states_passed_on_from_call_to_call_match_direct_calls():
    # Truncated backpropagation through time over the real layer op: each
    # call starts from the last call's (h_n, c_n), which the stand-in lent.
    g = torch.Generator().manual_seed(0)
    I, H, B, T = 3, 4, 2, 5
    w_ih, w_hh = torch.randn(4 * H, I, generator=g, dtype=torch.float64), torch.randn(4 * H, H, generator=g,
                                                                                        dtype=torch.float64)
    b = torch.randn(4 * H, generator=g, dtype=torch.float64)

    def layer(inputs):
        x, h, c = inputs
        out, h_n, c_n, _ = OPS.lstm_layer_forward(x, h, c, w_ih, w_hh, b, b, None, False)
        return [out, h_n, c_n]

    xs = [torch.randn(T, B, I, generator=g, dtype=torch.float64) for _ in range(5)]
    captures = _C._StandInGraphCaptures()
    h = c = torch.zeros(B, H, dtype=torch.float64)
    h_ref = c_ref = h
    outs = []
    for x in xs:
        (out, h, c), _ = captures.run([x, h, c], layer)
        out_ref, h_ref, c_ref = layer([x, h_ref, c_ref])
        outs.append((out, out_ref))
        assert torch.equal(h, h_ref) and torch.equal(c, c_ref)
    for out, out_ref in outs:
        assert torch.equal(out, out_ref)
