"""A simulator of the pipeline engine's schedule, for clusters one cannot run.

It plays the engine's own work-item order (``csrc/pipeline/schedule.h``)
over calibrated unit costs and a described cluster, and predicts the step
time, the bubble and the memory of each stage (``model.py`` says what it
takes and gives).
"""

from .model import PHASES, Cluster, Layout, Link, Prediction, UnitCosts, UnitInfo

__all__ = ["PHASES", "Cluster", "Layout", "Link", "Prediction", "UnitCosts", "UnitInfo"]
