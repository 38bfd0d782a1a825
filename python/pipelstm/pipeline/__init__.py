"""In-process pipelines: a sequential LSTM model split into stages on devices.

One module per concept: ``units`` (what a model flattens into), ``balance``
(costs and the split into stages), ``placement`` (devices, thread budgets,
parameters), ``prologue`` (what every front-end does before it builds a
core: settings checked, units, devices, costs), ``core`` (``PipelineCore``:
the engine and one differentiable run, which ``Pipeline``,
``pipelstm.LSTM(devices=...)`` and ``PipelineParallel``'s stage each hold;
``autograd``, that run as one autograd node), ``plan`` (the stages as a table),
``module`` (``Pipeline``) and ``lstm_stack`` (the pipelined mode of
``pipelstm.LSTM``). See docs/pipeline.md.

Its public name is ``Pipeline`` (``pipelstm.Pipeline``); the rest is
imported here for pipelstm's other modules and its tests, and is internal.
"""

from .balance import partition  # noqa: F401
from .core import PipelineCore  # noqa: F401
from .lstm_stack import LSTMPipeline  # noqa: F401
from .module import Pipeline
from .plan import Plan  # noqa: F401
from .units import Unit  # noqa: F401

__all__ = ["Pipeline"]
