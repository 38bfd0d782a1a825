"""In-process pipelines: a sequential LSTM model split into stages on devices.

One module per concept: ``units`` (what a model flattens into), ``balance``
(costs and the split into stages), ``placement`` (devices, thread budgets,
parameters), ``core`` (the engine and one differentiable run), ``plan``
(the stages as a table) and ``module`` (``Pipeline``). See docs/pipeline.md.
"""

from .balance import partition
from .module import Pipeline
from .plan import Plan
from .units import Unit

__all__ = ["Pipeline", "Plan", "Unit", "partition"]
