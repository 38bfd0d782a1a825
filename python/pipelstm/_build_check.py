"""The check that the compiled part (``pipelstm._C``) was built for the torch that is running.

A build for another torch fails to load with an unresolved symbol, or loads
and misbehaves: the C++ ABI of torch changes between releases. The build
records the version it was compiled against in ``pipelstm/_build_info.py``
(generated beside the module, see CMakeLists.txt); this check reads it
before the module is loaded and names both versions.
"""

from types import ModuleType
from typing import Optional

import torch

__all__ = ["build_info", "check_build"]

REBUILD = "pip install --no-build-isolation ."


def build_info() -> Optional[ModuleType]:
    """What the compiled part was built against (``pipelstm._build_info``),
    or None where the build did not record it."""
    try:
        from . import _build_info
    except ImportError:
        return None
    return _build_info


def _release(version: str) -> str:
    """A torch version without its local label: ``2.13.0+cpu`` -> ``2.13.0``.
    The label names the wheel's variant (CPU, a CUDA version), not the C++ ABI."""
    return str(version).split("+", 1)[0]


def check_build() -> None:
    """Raises ImportError when the compiled part was built against another
    torch release than the one running (the local label, ``+cpu`` or
    ``+cu128``, is not compared).

    Raises:
        ImportError: the versions differ; the message names both and the
            command that rebuilds.
    """
    info = build_info()
    if info is None:
        return  # a build that did not record it: the loader has the last word
    built, running = info.torch_version, torch.__version__
    if _release(built) != _release(running):
        raise ImportError(f"pipelstm was built against torch {built}, but torch {running} is running; "
                          f"rebuild with `{REBUILD}`")
