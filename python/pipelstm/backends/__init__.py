"""pipelstm's run-time switches, from Python (as ``torch.backends`` is torch's).

Each switch has an environment variable, which gives its value by default,
and the modules here read and set the user-facing ones:
:mod:`pipelstm.backends.cpu` (``isa``, ``gemm``, ``buffer_cache_mb``) and
:mod:`pipelstm.backends.cuda` (``graphs``, ``persistent``). A value set
from Python overrides the variable until it is deleted. The others
(``PIPELSTM_SPLIT_DEPTH``, ``PIPELSTM_ROW_SPLIT``, ``PIPELSTM_INPUT_IN_STEPS``,
``PIPELSTM_HOST_COPY_STREAM``) are knobs for measurements and tests, set by
their variable only. :func:`pipelstm.show_config` prints every switch, its
value and where the value came from; docs/configuration.md describes them all.
"""

from typing import Dict

from . import cpu, cuda

__all__ = ["cpu", "cuda", "attributes"]


def attributes() -> Dict[str, str]:
    """The Python attribute of each user-facing switch, by environment
    variable (``{"PIPELSTM_CPU_GEMM": "pipelstm.backends.cpu.gemm", ...}``)."""
    return {switch.env: f"{module.__name__}.{name}"
            for module in (cpu, cuda) for name, switch in type(module).switches().items()}
