"""What the stack graph's tests run on the CPU stand-in (tests/test_stack_graph.py)
and on a GPU (tests/gpu/test_gpu_stack_graph.py) alike."""

from pipelstm.backends import cuda


def two_calls_before_one_backward(model, warm, x1, x2):
    """A warm-up call and its backward, then ``model(x1)`` and ``model(x2)``
    and one backward of both (the parameters' gradients zeroed after the
    warm-up); returns the two outputs and the parameters' gradients."""
    model(warm)[0].sum().backward()
    model.zero_grad()
    a, _ = model(x1)
    b, _ = model(x2)  # with the stack graph: while a's backward is still to come
    (a.sum() + 2 * b.sum()).backward()
    return [a, b, *(p.grad for p in model.parameters())]


def check_two_calls_before_one_backward(plain, graphed, x, graphs, chunks, close):
    """The stack graph replays the first of two calls made before one
    backward and runs the second eagerly; ``close(got, want)`` holds for the
    lists of both outputs and every gradient against ``plain`` (no graphs)."""
    with cuda.flags(stack_graph=chunks):
        got = two_calls_before_one_backward(graphed, *x)
    assert graphs.replays == 1
    close(got, two_calls_before_one_backward(plain, *x))
