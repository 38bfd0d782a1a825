"""The CPU switches of pipelstm (as ``torch.backends.cpu`` is torch's).

Attributes (each overrides its environment variable while set; ``del``
drops the override; docs/configuration.md has the whole table):

* ``isa`` (``PIPELSTM_CPU_ISA``): the widest instruction set the fused CPU
  kernels may use: ``"native"`` (the default: the widest this CPU runs),
  ``"avx512"``, ``"avx2"`` or ``"generic"``. The kernels are chosen by the
  first call that runs them and kept for the process: set it before that
  call; a different value after it raises RuntimeError.
* ``gemm`` (``PIPELSTM_CPU_GEMM``): what runs a layer's whole-batch float32
  GEMMs: ``"auto"`` (the default: the kernels' own GEMM on AMD CPUs with
  AVX2 or AVX-512, ``at::mm`` elsewhere), ``"own"`` or ``"aten"``.
* ``buffer_cache_mb`` (``PIPELSTM_BUFFER_CACHE_MB``): at most this many MiB
  of freed large buffers are kept for reuse (default 1024; 0 keeps none).
  :func:`pipelstm.empty_cache` gives the kept ones back.

Functions: :func:`current_isa`, :func:`current_gemm`, and ``flags(**values)``,
a context manager that sets switches for a ``with`` block.
"""

import sys

from .. import _C
from ._switch import Switch, SwitchModule, choice, mebibytes

__all__ = ["isa", "gemm", "buffer_cache_mb", "current_isa", "current_gemm", "flags"]


class _CpuModule(SwitchModule):
    isa = Switch("PIPELSTM_CPU_ISA", choice("native", "avx512", "avx2", "generic"),
                 "The widest ISA of the fused CPU kernels: native (default), avx512, avx2 or generic.")
    gemm = Switch("PIPELSTM_CPU_GEMM", choice("auto", "own", "aten"),
                  "What runs a layer's whole-batch CPU float32 GEMMs: auto (default), own or aten.")
    buffer_cache_mb = Switch("PIPELSTM_BUFFER_CACHE_MB", mebibytes,
                             "MiB of freed large CPU buffers kept for reuse (default 1024; 0: none).")


def current_isa() -> str:
    """The ISA of the fused CPU kernels: avx512, avx2 or generic (before
    the first call that runs them, the one it will choose).

    Raises:
        RuntimeError: ``PIPELSTM_CPU_ISA`` holds a value it does not take.
    """
    return _C.cpu_isa()


def current_gemm() -> str:
    """What runs a layer's whole-batch CPU float32 GEMMs of 4 rows and more
    now: ``"own"`` (the fused kernels' packed-panel GEMM) or ``"aten"``.

    Raises:
        RuntimeError: ``PIPELSTM_CPU_GEMM`` holds a value it does not take.
    """
    return _C.cpu_gemm()


sys.modules[__name__].__class__ = _CpuModule
