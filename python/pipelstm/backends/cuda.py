"""The CUDA switches of pipelstm (as ``torch.backends.cudnn`` is torch's).

Attributes (each overrides its environment variable while set; ``del``
drops the override; docs/configuration.md has the whole table):

* ``graphs`` (``PIPELSTM_CUDA_GRAPHS``): replay each layer op's time loop
  as a captured CUDA graph: ``True`` every call, ``False`` never, ``None``
  (the default) where a step's launches, not its arithmetic, set the time.
* ``persistent`` (``PIPELSTM_PERSISTENT``): run a dense layer direction's
  recurrence as one persistent kernel (forward, and backward in float16
  and bfloat16): ``True`` wherever it fits, ``False`` never, ``None`` (the
  default) at the sizes where it measured faster (float16/bfloat16,
  T >= 500, B <= 8, H <= 512).
* ``persistent_kernel`` (``PIPELSTM_PERSISTENT_KERNEL``): which persistent
  kernels run where the persistent kernels do: ``"grid"`` (the default,
  the tensor-core kernels over the whole GPU), ``"cluster"`` or
  ``"cluster_async"`` (one thread-block cluster on Hopper, not yet
  measured; the grid kernels where a cluster does not fit).
* ``layer_wavefront`` (``PIPELSTM_LAYER_WAVEFRONT``): run the layers of a
  dense, unidirectional stack as a wavefront over this many time chunks,
  one stream a layer (``pipelstm.stack.wavefront``; default ``0``: one
  layer after another).
* ``stack_graph`` (``PIPELSTM_STACK_GRAPH``): capture a training call of a
  dense stack, forward and backward, as one CUDA graph each way and replay
  them (``pipelstm.stack.graph``): ``1`` the layers one after another,
  ``2`` to ``4096`` as a wavefront of that many time chunks (default ``0``:
  off).

All are read at each call. Functions: :func:`graph_counts`,
:func:`graph_memory`, and ``flags(**values)``, a context manager that sets
switches for a ``with`` block.
"""

import sys
from typing import Tuple

from .. import _C
from ..stack import graph as stack_graph_module
from ._switch import Switch, SwitchModule, choice, chunk_count, stack_chunks, tristate

__all__ = ["graphs", "persistent", "persistent_kernel", "layer_wavefront", "stack_graph", "graph_counts", "graph_memory",
           "flags"]


class _CudaModule(SwitchModule):
    graphs = Switch("PIPELSTM_CUDA_GRAPHS", tristate,
                    "Replay layer ops as CUDA graphs: True (every call), False (never), None (default: "
                    "where launches set the time).")
    persistent = Switch("PIPELSTM_PERSISTENT", tristate,
                        "Run a dense layer's recurrence as one persistent kernel: True (wherever it fits), False "
                        "(never), None (default: where it measured faster).")
    persistent_kernel = Switch("PIPELSTM_PERSISTENT_KERNEL", choice("grid", "cluster", "cluster_async"),
                               "Which persistent kernels run where they do: grid (default: over the whole GPU), "
                               "cluster or cluster_async (one thread-block cluster, Hopper; not yet measured).")
    layer_wavefront = Switch("PIPELSTM_LAYER_WAVEFRONT", chunk_count,
                             "Run a stack's layers as a wavefront over this many time chunks, one CUDA stream a "
                             "layer (default 0: one layer after another).")
    stack_graph = Switch("PIPELSTM_STACK_GRAPH", stack_chunks,
                         "Capture a training call of a stack as one CUDA graph each way: 1 (the layers one after "
                         "another), 2 to 4096 (a wavefront of that many time chunks), 0 (default: off).")


def graph_counts() -> Tuple[int, int]:
    """(captures, replays) of the layer ops' CUDA graphs in this process."""
    return tuple(_C._graph_counts())


def graph_memory() -> int:
    """Bytes of device memory the CUDA graphs pipelstm keeps hold now: the
    layer ops' and the stacks'."""
    return int(_C._graph_memory()) + stack_graph_module.graph_memory()


sys.modules[__name__].__class__ = _CudaModule
