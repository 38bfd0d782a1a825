"""A stacked LSTM's layers on one CUDA device, captured as one CUDA graph each way.

Each layer op may replay its own time loop as a graph (``graphs``), but a
stack of L layers still launches L graphs forward and as many backward, one
after another, and above the graphs' size bound every step's kernels one by
one: where the host takes longer to launch them than the GPU to run them,
the GPU waits. With ``pipelstm.backends.cuda.stack_graph``
(``PIPELSTM_STACK_GRAPH``) set to K, a training call of a dense CUDA stack
is captured once per shape, its forward and its backward as two graphs, and
later calls replay them: one launch each way. With K = 1 the layers run one
after another inside the graph; with K >= 2 (a unidirectional stack of two
or more layers) as the wavefront of ``wavefront.py`` over K time
chunks, whose (layer, chunk) pieces become parallel branches of the one
graph: layer l+1's chunk k runs beside layer l's chunk k+1 with no launch
between them.

A graph computes in buffers of its own, which each replay overwrites:

* outputs and gradients are handed out as copies;
* a call made while an earlier call's backward is still to come (its
  outputs alive and no backward yet: two calls before one backward) runs
  eagerly instead, so that it cannot overwrite what that backward reads;
* a backward whose forward was replayed over since (``retain_graph=True``,
  and a second backward after another call) raises rather than read
  another call's buffers.

Training calls only: grad enabled and a parameter requiring grad, a dense
(not packed) input, outside torch.func transforms, tracing, export and
autocast. The first call of a shape runs eagerly (cuBLAS and the kernels
initialise outside a capture; a new capture stream runs a GEMM and its
backward first, for its own cuBLAS workspaces), the second captures; at most
``MAX_GRAPHS`` shapes are kept, the least recently used dropped. A shape
whose capture fails warns and runs eagerly from then on.
"""

import contextlib
import warnings
import weakref
from collections import OrderedDict
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


__all__ = ["call_key", "StackGraphs", "graphed_stack", "graph_memory", "MAX_GRAPHS"]

MAX_GRAPHS = 8

# body(*inputs, *params) -> outputs: the stack's forward, reading the
# parameters in place.
Body = Callable[..., Tuple[Tensor, ...]]


def call_key(inputs: Sequence[Tensor], params: Sequence[Tensor], *extra: Hashable) -> tuple:
    """What a capture depends on: the inputs' shapes, strides, dtypes,
    devices and whether they require grad, the parameters' addresses too
    (the graph reads them in place), the precision switches the GEMMs
    follow, and ``extra`` (the caller's: chunks, dropout, layers, and the
    kernel switches of its route, ``StackRoute.kernels``)."""
    def describe(t: Tensor, address: bool) -> tuple:
        return (t.data_ptr() if address else None, tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad)

    return (tuple(describe(t, False) for t in inputs), tuple(describe(p, True) for p in params),
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()) + tuple(extra)


class Captured:
    """One shape's forward and backward graphs and the buffers they compute
    in: ``inputs`` (copied into before a replay), ``outputs``,
    ``grad_outputs`` (copied into before the backward's replay), ``grads``
    (one per input and parameter that requires grad, None where unused)."""

    def __init__(self) -> None:
        self.calls = 0  # eager ones
        self.failed = False
        self.forward = self.backward = None  # each has replay()
        self.inputs: List[Tensor] = []
        self.outputs: List[Tensor] = []
        self.grad_outputs: List[Tensor] = []
        self.grads: List[Optional[Tensor]] = []
        self.wants_grad: List[bool] = []  # per input, then per parameter
        self.bytes = 0  # device memory the graphs hold
        self.generation = 0  # forward replays so far
        self.open: Optional[weakref.ref] = None  # the replay whose backward is still to come

    def pending(self) -> bool:
        """Whether a replay's backward may still come: its autograd context
        is alive and its backward has not run."""
        return self.open is not None and self.open() is not None

    def prepare(self, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> List[Tensor]:
        """The graph's own inputs (copies requiring grad as the given ones
        do); returns what the backward differentiates for."""
        self.inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        both = [*self.inputs, *params]
        self.wants_grad = [t.requires_grad for t in both]
        return [t for t in both if t.requires_grad]


def capture_cuda(entry: Captured, body: Body, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> None:
    """Captures ``body``'s forward and its backward as two CUDA graphs
    sharing one memory pool."""
    targets = entry.prepare(inputs, params)
    device = inputs[0].device
    torch.cuda.synchronize(device)
    pool = torch.cuda.graph_pool_handle()
    forward, backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    stream = _capture_stream(torch.cuda.current_stream(device), inputs[0].dtype)
    # Relaxed: another thread's CUDA calls (a data loader's, a pipeline
    # stage's) do not break the capture. "thread_local" should have done as
    # much, but it broke the backward's capture of a stack run layer after
    # layer (docs/design/cuda.md); "relaxed" and "global" captured it.
    with _naming_failure("the forward's capture"), \
            torch.cuda.graph(forward, pool=pool, stream=stream, capture_error_mode="relaxed"):
        outputs = body(*entry.inputs, *params)
    entry.grad_outputs = [torch.empty_like(o) for o in outputs]
    with _naming_failure("the backward's capture"), \
            torch.cuda.graph(backward, pool=pool, stream=stream, capture_error_mode="relaxed"):
        entry.grads = list(torch.autograd.grad(outputs, targets, entry.grad_outputs, allow_unused=True))
    entry.outputs = [o.detach() for o in outputs]
    entry.forward, entry.backward = forward, backward
    entry.bytes = _pool_bytes(device, pool)


@contextlib.contextmanager
def _naming_failure(what: str):
    """A RuntimeError raised inside, with ``what`` failed in front."""
    try:
        yield
    except RuntimeError as e:
        raise RuntimeError(f"{what}: {e}") from e


def _pool_bytes(device: torch.device, pool) -> int:
    """The device memory a graph pool holds: the segments torch's allocator
    made for it (the rise of its reserved total undercounts them where it
    freed cached blocks to make room during the capture)."""
    segments = torch.cuda.memory._snapshot(device)["segments"]
    return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(pool))


_capture_streams: Dict[Tuple[torch.device, int], "torch.cuda.Stream"] = {}


def _capture_stream(replay: "torch.cuda.Stream", dtype: torch.dtype) -> "torch.cuda.Stream":
    """The stream to capture graphs replayed on ``replay`` on, one for each
    such stream: a captured GEMM keeps its capture stream's cuBLAS
    workspace, so graphs replayed at once on two streams must not share
    one (torch.cuda.graph's own default stream is shared by every capture).
    A new one runs a GEMM in float32 and in ``dtype`` before its first
    capture (``_warm``)."""
    key = (replay.device, replay.cuda_stream)
    if key not in _capture_streams:
        stream = torch.cuda.Stream(replay.device)
        _warm(stream, replay, dtype)
        _capture_streams[key] = stream
    return _capture_streams[key]


def _warm(stream: "torch.cuda.Stream", replay: "torch.cuda.Stream", dtype: torch.dtype) -> None:
    """cuBLAS makes a workspace for each thread's handle and stream (and
    cuBLASLt its own) at their first GEMM: here, outside any capture, for
    this thread and for autograd's (a backward), rather than inside the
    first capture, whose eager warm-up call ran on ``replay``."""
    stream.wait_stream(replay)
    with torch.cuda.stream(stream), torch.enable_grad():
        for kind in dict.fromkeys((torch.float32, dtype)):
            a = torch.ones(16, 16, device=stream.device, dtype=kind, requires_grad=True)
            torch.mm(a, a).sum().backward()
            torch.addmm(a[0], a, a).sum().backward()  # with a bias: cuBLASLt where torch uses it
    stream.synchronize()


class StackGraphs:
    """Captured stacks by call key (``call_key``), least recently used
    dropped past ``max_graphs``.

    Args:
        capture: ``capture(entry, body, inputs, params)`` fills a
            :class:`Captured` (``capture_cuda``; tests give a CPU stand-in).
        max_graphs: shapes kept at once.
    """

    def __init__(self, capture: Callable[[Captured, Body, Sequence[Tensor], Sequence[Tensor]], None] = capture_cuda,
                 max_graphs: int = MAX_GRAPHS) -> None:
        self.capture, self.max_graphs = capture, max_graphs
        self.entries: "OrderedDict[Hashable, Captured]" = OrderedDict()
        self.captures = self.replays = 0

    def __call__(self, key: Hashable, body: Body, inputs: Sequence[Tensor],
                 params: Sequence[Tensor]) -> Tuple[Tensor, ...]:
        """``body(*inputs, *params)``, replayed from its graphs where they
        are captured and free, else run directly."""
        if not any(t.requires_grad for t in (*inputs, *params)):
            return tuple(body(*inputs, *params))  # nothing to differentiate: no backward to capture
        entry = self._entry(key)
        if entry.failed or entry.calls == 0 or entry.pending():
            entry.calls += 1
            return tuple(body(*inputs, *params))
        if entry.forward is None:
            try:
                self.capture(entry, body, inputs, params)
            except RuntimeError as e:
                entry.failed, entry.forward, entry.backward = True, None, None
                entry.inputs, entry.outputs, entry.grad_outputs, entry.grads = [], [], [], []
                warnings.warn(f"pipelstm: a stack of LSTM layers could not be captured as a CUDA graph; this shape "
                              f"runs eagerly from now on ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
                return tuple(body(*inputs, *params))
            self.captures += 1
        self.replays += 1
        return _Replay.apply(entry, len(inputs), *inputs, *params)

    def _entry(self, key: Hashable) -> Captured:
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = Captured()
            while len(self.entries) > self.max_graphs:
                self.entries.popitem(last=False)  # a replay in flight keeps its entry alive
        else:
            self.entries.move_to_end(key)
        return entry

    def memory(self) -> int:
        """Bytes of device memory the kept graphs hold."""
        return sum(e.bytes for e in self.entries.values())


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, entry: Captured, n_inputs: int, *tensors: Tensor) -> Tuple[Tensor, ...]:
        for mine, given in zip(entry.inputs, tensors[:n_inputs]):
            if mine.data_ptr() != given.data_ptr():
                mine.detach().copy_(given)
        entry.forward.replay()
        entry.generation += 1
        ctx.entry, ctx.generation = entry, entry.generation
        entry.open = weakref.ref(ctx)
        return tuple(o.clone() for o in entry.outputs)  # the next replay overwrites the graph's own

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: Tensor) -> Tuple[Optional[Tensor], ...]:
        entry = ctx.entry
        if ctx.generation != entry.generation:
            raise RuntimeError(
                "pipelstm: this backward's forward ran as a CUDA graph of the LSTM stack, and another call has "
                "replayed that graph since, so its buffers hold that call's values: run each backward before the "
                "next call of the same shape, or set pipelstm.backends.cuda.stack_graph = 0")
        for mine, given in zip(entry.grad_outputs, grads):
            mine.copy_(given)  # autograd gives zeros for an output with no gradient
        entry.backward.replay()
        if entry.open is not None and entry.open() is ctx:
            entry.open = None
        grads_out: List[Optional[Tensor]] = [None, None]
        computed = iter(entry.grads)
        for wants in entry.wants_grad:
            g = next(computed) if wants else None
            grads_out.append(None if g is None else g.clone())
        return tuple(grads_out)


_graphs = StackGraphs()


def graphed_stack(key: Hashable, body: Body, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> Tuple[Tensor, ...]:
    """``body(*inputs, *params)`` through this process's stack graphs."""
    return _graphs(key, body, inputs, params)


def graph_memory() -> int:
    """Bytes of device memory this process's stack graphs hold."""
    return _graphs.memory()
