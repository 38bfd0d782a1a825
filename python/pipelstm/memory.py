"""The CPU buffer cache, from Python (as ``torch.cuda.memory_stats`` and
``torch.cuda.empty_cache`` are for torch's CUDA allocator).

pipelstm maps CPU buffers of 64 KiB and more itself (large ones on huge
pages, csrc/cpu/huge_pages.h) and keeps freed ones, up to
``pipelstm.backends.cpu.buffer_cache_mb``, for the next call of about their
size: repeated calls then write memory that is already resident.
"""

from typing import Dict

from . import _C

__all__ = ["memory_stats", "empty_cache"]


def memory_stats() -> Dict[str, int]:
    """The CPU buffer cache's counters. Bytes are whole mappings, alignment
    room included; all zero where buffers are not mapped this way (no
    ``MADV_HUGEPAGE``).

    Returns:
        A dict: ``kept_bytes`` and ``kept_mappings`` (freed buffers kept for
        reuse), ``in_use_bytes`` (held by tensors), ``mapped_bytes`` and
        ``peak_mapped_bytes`` (in use or kept: now, and the most so far),
        ``hits`` and ``misses`` (requests served by a kept buffer, or mapped
        afresh).
    """
    return dict(_C._buffer_cache_stats())


def empty_cache() -> None:
    """Gives every freed buffer the CPU buffer cache keeps back to the
    system; buffers in use stay. The next calls map theirs afresh (and
    fault their pages in again)."""
    _C._empty_buffer_cache()
