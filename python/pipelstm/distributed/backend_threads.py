"""What the collectives' tensors need to outlive: the backend's own threads.

gloo's worker thread drops its reference to a collective's tensors after
the collective has returned to Python (or failed), and dropping a reference
to a tensor Python knows takes the interpreter's lock. Once Python has
begun to shut down, that thread cannot take it, and the process aborts
(``terminate called without an active exception``). These two keep that
from happening: after a collective that succeeded, by waiting for the
thread; after one that failed (the thread may finish it only later), by
never freeing its tensors.
"""

import ctypes
import time
from types import TracebackType
from typing import Optional, Sequence

import torch

__all__ = ["released_by_the_backend", "outlive_the_backend"]


def released_by_the_backend(tensors: Sequence[torch.Tensor], timeout: float) -> None:
    """Waits (up to ``timeout`` seconds) until no backend thread holds any
    of ``tensors``, which Python alone held before the collective.

    gloo's worker thread drops its reference to a collective's tensors
    after the collective has returned to Python, and dropping a reference
    to a tensor Python knows takes the interpreter's lock. Once Python has
    begun to shut down, that thread cannot take it and the process aborts
    (``terminate called without an active exception``) after a run that
    succeeded, if the thread had not been scheduled since the job's last
    collective: on a loaded machine it may not have been for milliseconds.
    Waiting here, with the lock released, lets it finish first.
    """
    deadline = time.monotonic() + timeout
    for t in tensors:
        while t._use_count() > 1 and time.monotonic() < deadline:
            time.sleep(1e-4)


def outlive_the_backend(tb: Optional[TracebackType]) -> None:
    """Keeps the tensors of a failed collective's frames alive for the rest
    of the process.

    The backend's own thread may still hold them after the error reached
    Python (gloo finishes a timed-out collective on its worker thread). A
    tensor Python has let go of is then owned by that thread, which must
    take the interpreter's lock to free it; once Python has begun to shut
    down it cannot, and the process aborts (``terminate called without an
    active exception``) after printing the error. With a reference of
    Python's own that is never dropped, the thread's is never the last.
    """
    seen = set()
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
        tb = tb.tb_next
