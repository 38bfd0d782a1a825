"""pipelstm: fused, pipelined, distributed stacked LSTMs for PyTorch."""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.pipelstm.*)
from . import ops
from .lstm import LSTM, LSTMCell
from .pipeline import Pipeline
from . import serialization  # noqa: F401  (torch.load(weights_only=True) of pipelstm's modules)

__all__ = ["LSTM", "LSTMCell", "Pipeline", "ops", "built_with_cuda"]
__version__ = "0.1.0"


def built_with_cuda() -> bool:
    """Whether this build contains the CUDA kernels."""
    return _C.built_with_cuda()
