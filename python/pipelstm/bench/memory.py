"""Resident memory of this process, for per-process peaks (Linux ``/proc``).

``reset_peak()`` clears the kernel's high-water mark of the resident set
(``VmHWM``, by writing 5 to ``/proc/self/clear_refs``) so that
``peak_bytes()`` tells the largest resident set since then: everything the
process touched (tensors, the allocator's free lists, libraries), measured
by the kernel, not estimated. Where that is not possible, ``peak_bytes()``
falls back to ``ru_maxrss`` (the peak since the process started).
``device_peak_bytes(run)``: the same for a CUDA device, from torch's
caching allocator.
"""

import re
import resource
from typing import Optional

import torch

__all__ = ["rss_bytes", "peak_bytes", "reset_peak", "available_bytes", "device_peak_bytes"]


def _kib_field(path: str, field: str) -> Optional[int]:
    """Bytes of a ``field:  N kB`` line of a /proc file (None if absent)."""
    try:
        with open(path) as f:
            m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def _status(field: str) -> Optional[int]:
    return _kib_field("/proc/self/status", field)


def rss_bytes() -> Optional[int]:
    """The resident set now (None off Linux)."""
    return _status("VmRSS")


def reset_peak() -> bool:
    """Restarts the peak from the resident set now; False if the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """The largest resident set since :func:`reset_peak` (or since the start)."""
    hwm = _status("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_bytes() -> Optional[int]:
    """``MemAvailable`` of the machine (None off Linux)."""
    return _kib_field("/proc/meminfo", "MemAvailable")


def device_peak_bytes(run, device=None) -> int:
    """The CUDA caching allocator's peak over one call of ``run`` on
    ``device`` (default: the current one), less what was allocated before it."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
