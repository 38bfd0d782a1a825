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
* ``benchmark`` (``PIPELSTM_CPU_BENCHMARK``): ``True`` times each float32
  layer call shape on every candidate path (the kernels' ISA builds, each
  with its own GEMM or ATen's, and for a forward with small enough
  weights with the input projection inside the steps) over its first
  calls and keeps the fastest for the process, as
  ``torch.backends.cudnn.benchmark`` does on the GPU;
  ``False`` (the default) takes the CPU's default path. The paths differ
  only in rounding; once chosen, a shape's path does not change.
* ``benchmark_cache`` (``PIPELSTM_CPU_BENCHMARK_CACHE``): a file that keeps
  the choices between processes (read at the first timed call, appended to
  at each choice); ``""`` (the default) keeps none.
* ``buffer_cache_mb`` (``PIPELSTM_BUFFER_CACHE_MB``): at most this many MiB
  of freed large buffers are kept for reuse (default 1024; 0 keeps none).
  :func:`pipelstm.empty_cache` gives the kept ones back.

Functions: :func:`current_isa`, :func:`current_gemm`, :func:`current_cpu`,
:func:`chosen_paths`, and ``flags(**values)``, a context manager that sets
switches for a ``with`` block.
"""

import sys

from .. import _C
from typing import Dict, List

from ._switch import Switch, SwitchModule, choice, file_path, flag, mebibytes

__all__ = ["isa", "gemm", "benchmark", "benchmark_cache", "buffer_cache_mb", "current_isa", "current_gemm",
           "current_cpu", "chosen_paths", "flags"]


class _CpuModule(SwitchModule):
    isa = Switch("PIPELSTM_CPU_ISA", choice("native", "avx512", "avx2", "generic"),
                 "The widest ISA of the fused CPU kernels: native (default), avx512, avx2 or generic.")
    gemm = Switch("PIPELSTM_CPU_GEMM", choice("auto", "own", "aten"),
                  "What runs a layer's whole-batch CPU float32 GEMMs: auto (default), own or aten.")
    benchmark = Switch("PIPELSTM_CPU_BENCHMARK", flag,
                       "Each float32 call shape's CPU path chosen by timing its first calls (default False).")
    benchmark_cache = Switch("PIPELSTM_CPU_BENCHMARK_CACHE", file_path,
                             "A file keeping the timed choices between processes (default \"\": none).")
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


def current_cpu() -> Dict[str, object]:
    """This CPU as the kernels see it.

    Returns:
        A dict: ``vendor`` (``"AMD"``, ``"Intel"`` or cpuid's vendor
        string), ``family`` and ``model`` (cpuid's, extended parts added),
        ``microarchitecture`` (``zen``, ``zen2`` ... ``zen5``,
        ``intel-amx`` (Sapphire Rapids and later Xeons, told by their AMX
        tiles), ``intel-avx512`` (earlier AVX-512 parts), ``intel-avx2``
        or ``other``), ``vector_datapath_bits`` (the width of its FMA
        units: Zen 4 runs AVX-512 on 256-bit ones) and ``l2_bytes`` (one
        core's L2, 0 where the OS does not say).
    """
    return dict(_C._cpu_identity())


def chosen_paths() -> List[Dict[str, object]]:
    """The CPU paths that timing (``benchmark = True``) has chosen so far.

    Returns:
        One dict per call shape: ``shape`` (the pass, T, B, rows, I, H, P,
        threads and the candidate paths), ``path`` (the one kept, e.g.
        ``"avx2/own"``: the kernels' ISA build, then whose GEMM, or
        ``"avx512/in-steps"``: a forward's input projection in its
        steps), ``seconds`` (each candidate's best timed call; empty where
        read from the cache file), ``trials`` (each candidate's timed
        calls: 2, or 1 where its first took over 1.25x the best first) and
        ``from_cache``.
    """
    return list(_C._cpu_chosen_paths())


sys.modules[__name__].__class__ = _CpuModule
