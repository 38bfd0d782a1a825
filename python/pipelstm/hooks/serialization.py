"""Whole-model ``torch.load`` with ``weights_only=True`` (PyTorch's default).

Scripts that ``torch.save(model)`` allowlist the ``torch.nn`` classes they
use and their own model class, then ``torch.load(path)``. A model holding
pipelstm's modules must load the same way, with nothing added to the
script, so pipelstm registers its classes as safe globals on import
(``register``), as libraries with their own serialisable modules do.

They are safe to allowlist: unpickling one sets attributes (plain data,
tensors, devices, submodules, each itself checked by the weights-only
unpickler); the pipelined modules then build their engine from those specs
(``PipelineCore.__setstate__``). Nothing else runs.
"""

import torch

from ..layernorm_lstm import LayerNormLSTM
from ..layernorm_lstm_cell import LayerNormLSTMCell
from ..locked_dropout import LockedDropout
from ..lstm import LSTM, LSTMCell
from ..pipeline import LSTMPipeline, Pipeline, PipelineCore, Unit
from ..regularisation import Regularisation

__all__ = ["SAFE_GLOBALS", "register"]

SAFE_GLOBALS = [LSTM, LSTMCell, LayerNormLSTM, LayerNormLSTMCell, LockedDropout, Pipeline, PipelineCore, LSTMPipeline,
                Unit, Regularisation, (LSTMCell, "pipelstm.lstm.LSTMCell")]  # its name in pickles made before lstm_cell.py



def register() -> None:
    """Allowlists pipelstm's modules for ``torch.load(weights_only=True)``."""
    torch.serialization.add_safe_globals(SAFE_GLOBALS)
