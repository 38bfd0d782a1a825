"""What every front-end does before it builds a :class:`PipelineCore`.

``pipelstm.Pipeline``, ``pipelstm.LSTM(devices=...)`` and
``pipelstm.distributed.PipelineParallel`` all start the same way: the
settings checked, the model flattened into units, the stages' devices
checked against them, and the units' costs estimated for the balancing.
"""

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .balance import estimate_costs
from .placement import check_stage_count, stage_devices
from .units import LSTM_KINDS, Unit, flatten, loss_spec

__all__ = ["CHECKPOINT_MODES", "Prepared", "check_checkpoint", "check_positive_ints", "prepare"]

CHECKPOINT_MODES = ("never", "except_last", "always")


def check_checkpoint(who: str, checkpoint: str) -> str:
    """Returns ``checkpoint``.

    Raises:
        ValueError: not one of ``CHECKPOINT_MODES``.
    """
    if checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"{who}: checkpoint must be one of {', '.join(map(repr, CHECKPOINT_MODES))}, "
                         f"got {checkpoint!r}")
    return checkpoint


def check_positive_ints(who: str, **values) -> None:
    """Raises:
        ValueError: a value (named by its keyword) is not an int >= 1.
    """
    for what, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{who}: {what} must be a positive int, got {v!r}")


@dataclass
class Prepared:
    """What :func:`prepare` gives a front-end."""

    units: List[Unit]  # with their cost estimated
    loss: Optional[dict]  # units.loss_spec of the loss_fn, or None
    devices: Optional[List[torch.device]]  # checked; None where none were given
    sample_shape: Optional[Tuple[int, int]]  # (T, B) of a profiled sample, else None
    batch_first: bool  # the LSTMs' layout (all agree where one_layout)


def prepare(who: str, children: Iterable[Tuple[str, nn.Module]],
            devices: Optional[Sequence[Union[str, torch.device]]] = None, *, chunks: int, micro_batches: int,
            checkpoint: str = "never", loss_fn: Optional[nn.Module] = None, sample: Optional[Tensor] = None,
            one_layout: bool = False) -> Prepared:
    """The shared prologue of the front-ends, in this order: ``chunks`` and
    ``micro_batches`` and ``checkpoint`` checked, the loss, the devices, the
    model's ``children`` flattened into units (at most one stage per unit),
    and the units' costs estimated (by profiling on ``sample``, given in the
    LSTMs' layout, or by the FLOP cost model).

    Args:
        who: what error messages name, e.g. ``"Pipeline"``.
        children: ``named_children()`` of the model (``[("", lstm)]`` for one LSTM).
        devices: the stages' devices, or None (the caller places the stages).
        one_layout: all LSTMs must agree on ``batch_first``.

    Raises:
        ValueError: a setting out of range, an unsupported loss, module or
            device, more devices than units, or LSTMs of both layouts.
    """
    check_positive_ints(who, chunks=chunks, micro_batches=micro_batches)
    check_checkpoint(who, checkpoint)
    loss = loss_spec(loss_fn)
    if devices is not None:
        devices = stage_devices(who, devices)
    units = flatten(children)
    if devices is not None:
        check_stage_count(who, len(devices), units)
    layouts = {u.module.batch_first for u in units if u.kind in LSTM_KINDS}
    if one_layout and len(layouts) > 1:
        raise ValueError(f"{who}: all LSTMs must agree on batch_first")
    batch_first = layouts == {True}
    if sample is not None and batch_first:
        sample = sample.transpose(0, 1)
    sample_shape = estimate_costs(units, sample)
    return Prepared(units, loss, devices, sample_shape, batch_first)
