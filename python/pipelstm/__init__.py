"""pipelstm: fused, pipelined, distributed stacked LSTMs for PyTorch."""

import logging

import torch  # noqa: F401  (loads libtorch before the extension)

from ._version import __version__  # noqa: F401

# Quiet unless the application configures logging (the library convention).
logging.getLogger(__name__).addHandler(logging.NullHandler())

from ._build_check import check_build  # noqa: E402

check_build()  # before the loader, whose error for another torch names no version

from . import _C  # noqa: E402,F401  (the kernels and the ops' schemas, torch.ops.pipelstm.*)
from . import layernorm_ops, ops  # noqa: E402
from .lstm import LSTM, LSTMCell  # noqa: E402
from .layernorm_lstm import LayerNormLSTM  # noqa: E402
from .layernorm_lstm_cell import LayerNormLSTMCell  # noqa: E402
from .pipeline import Pipeline  # noqa: E402
from .awd_checkpoint import awd_state_dict  # noqa: E402
from .locked_dropout import LockedDropout  # noqa: E402
from . import backends, hooks  # noqa: E402

layernorm_ops.register()  # the LayerNorm layer's composition, a kernel from Python
hooks.register()  # fake kernels, autocast rules, safe globals for torch.load
from .config import config_info, log_choices, show_config  # noqa: E402
from .memory import empty_cache, memory_stats  # noqa: E402

__all__ = ["LSTM", "LSTMCell", "LayerNormLSTM", "LayerNormLSTMCell", "LockedDropout", "Pipeline", "ops", "backends",
           "awd_state_dict", "built_with_cuda", "config_info", "show_config", "empty_cache", "memory_stats"]


def built_with_cuda() -> bool:
    """Whether this build contains the CUDA kernels."""
    return _C.built_with_cuda()


log_choices()  # the CPU kernels' ISA and GEMMs, at DEBUG
