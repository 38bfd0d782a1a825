"""csrc/lent_buffers.h: a graph's outputs handed out without a copy.

The owner (a CUDA graph, csrc/cuda/graph_replay_cuda.cpp) writes its
buffers again only once returned() says nothing lent from them is left; so
every way a caller can keep a lent tensor's memory must keep it lent. The
class is device-neutral, and these tests run it on CPU tensors.
"""

import gc

import pytest
import torch

from pipelstm import _C


def _buffers():
    return [torch.arange(12.0).reshape(3, 4), torch.arange(30.0).reshape(5, 6)[1:, 2:]]


def test_lent_tensors_read_the_buffers_memory_with_their_layout():
    buffers = _buffers()
    lent = _C._LentBuffers().lend(buffers)
    for got, b in zip(lent, buffers):
        assert got.data_ptr() == b.data_ptr()
        assert (got.shape, got.stride(), got.storage_offset()) == (b.shape, b.stride(), b.storage_offset())
        assert torch.equal(got, b)
    buffers[0].add_(1)  # the owner writes again: the lent tensor reads it (no copy)
    assert torch.equal(lent[0], buffers[0])


def test_a_lent_tensor_and_its_views_are_known_as_lent():
    buffer = torch.zeros(3, 4)
    lent, = _C._LentBuffers().lend([buffer])
    assert _C._is_lent(lent) and _C._is_lent(lent[1:].t())
    assert not _C._is_lent(buffer)
    assert not _C._is_lent(lent.clone())


@pytest.mark.parametrize("first", [0, 1])
def test_returned_once_the_lent_tensors_are_gone(first):
    lender = _C._LentBuffers()
    lent = lender.lend(_buffers())
    assert not lender.returned()
    del lent[first]
    assert not lender.returned()
    lent.clear()
    assert lender.returned()


@pytest.mark.parametrize("keep", [
    lambda t: t[1],                                    # a view
    lambda t: t.detach(),                              # another tensor over its storage
    lambda t: t.untyped_storage(),                     # the storage itself
    lambda t: (torch.ones(4, requires_grad=True) * t).grad_fn,  # saved for a backward
    lambda t: [t.view(-1)],                            # a view inside a container
], ids=["view", "detach", "storage", "saved", "list"])
def test_anything_that_keeps_the_memory_keeps_it_lent(keep):
    lender = _C._LentBuffers()
    lent = lender.lend([torch.arange(12.0).reshape(3, 4)])
    kept = keep(lent[0])
    del lent
    gc.collect()
    assert not lender.returned()
    del kept
    gc.collect()
    assert lender.returned()


def test_a_lent_tensor_outlives_the_owners_buffer():
    buffers = _buffers()
    expected = [b.clone() for b in buffers]
    lent = _C._LentBuffers().lend(buffers)
    del buffers
    gc.collect()
    junk = [torch.full((64, 64), -1.0) for _ in range(8)]  # would take freed memory
    for got, e in zip(lent, expected):
        assert torch.equal(got, e)
    del junk


def test_a_lent_tensor_cannot_be_resized_off_the_buffer():
    lent = _C._LentBuffers().lend([torch.zeros(3, 4)])
    lent[0].resize_(2, 4)  # within its memory: allowed
    with pytest.raises(RuntimeError, match="not resizable"):
        lent[0].resize_(100, 4)


def test_a_second_loan_adds_to_the_first():
    lender = _C._LentBuffers()
    first = lender.lend([torch.zeros(2)])
    second = lender.lend([torch.zeros(2)])
    del second
    assert not lender.returned()
    del first
    assert lender.returned()


def test_on_return_is_called_as_each_lent_tensors_memory_is_let_go():
    lender = _C._LentBuffers()
    lent = lender.lend([torch.zeros(2), torch.zeros(3)])
    assert lender.on_return_calls() == 0
    view = lent[1][1:]
    lent.clear()
    assert lender.on_return_calls() == 1
    del view
    assert lender.on_return_calls() == 2 and lender.returned()
