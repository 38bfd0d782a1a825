"""A simulator of the pipeline engine's schedule, for clusters one cannot run.

It plays the engine's own work-item order (``csrc/pipeline/schedule.h``)
over calibrated unit costs and a described cluster, and predicts the step
time, the bubble and the memory of each stage (``model.py`` says what it
takes and gives): ``calibrate`` measures a model's units on this machine,
``predict`` plays a layout of them on a cluster.
"""

from .calibrate import Calibrator, calibrate
from .costs import FittedCosts
from .model import PHASES, Cluster, Layout, Link, Prediction, UnitCosts, UnitInfo
from .predict import predict

__all__ = ["Cluster", "Layout", "Link", "Prediction", "UnitCosts", "UnitInfo", "FittedCosts", "Calibrator",
           "calibrate", "predict"]
