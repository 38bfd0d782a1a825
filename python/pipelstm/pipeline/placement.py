"""Placement: the stages' devices and thread budgets, and the parameters on them."""

import logging
import os
from typing import List, Sequence, Union

import torch

from .units import Unit

__all__ = ["stage_devices", "check_stage_count", "thread_budgets", "cap_threads", "place"]

logger = logging.getLogger(__name__)


def stage_devices(who: str, devices) -> List[torch.device]:
    """The stages' devices, checked: a non-empty list of available devices.

    Raises:
        ValueError: a single device rather than a list, an empty list, or an
            unknown, unsupported or unavailable device.
    """
    if isinstance(devices, (str, torch.device)) or len(devices) == 0:
        raise ValueError(f"{who}: devices must be a non-empty list of devices, got {devices!r}")
    return [_check_device(who, d) for d in devices]


def _check_device(who: str, d) -> torch.device:
    try:
        dev = torch.device(d)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"{who}: unknown device {d!r} ({e})") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{who}: device {d!r} is not available (no CUDA device on this machine)")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(f"{who}: unknown device {d!r} ({torch.cuda.device_count()} CUDA devices)")
        return torch.device("cuda", index)
    raise ValueError(f"{who}: unsupported device {d!r}; use 'cpu' or 'cuda:N'")


def check_stage_count(who: str, stages: int, units: Sequence[Unit]) -> None:
    """Raises:
        ValueError: more stages than units (a stage would be empty).
    """
    if stages > len(units):
        raise ValueError(f"{who}: {stages} stages but only {len(units)} units ({', '.join(u.name for u in units)}); "
                         "use at most as many devices as units")


def thread_budgets(threads: Union[None, int, Sequence[int]], devices: Sequence[torch.device],
                   who: str = "Pipeline") -> List[int]:
    """Intra-op threads per stage (0 for accelerators): given, or the
    caller's ``torch.get_num_threads()`` shared among the CPU stages. A CPU
    stage gets 1 to ``os.cpu_count()`` threads.

    Raises:
        TypeError: ``threads`` is neither None, an int nor a sequence of ints.
        ValueError: not one count per stage, or a count out of range.
    """
    cpus = os.cpu_count() or 1
    if threads is None:
        per = max(1, torch.get_num_threads() // max(1, sum(d.type == "cpu" for d in devices)))
        threads = [per if d.type == "cpu" else 0 for d in devices]
    elif isinstance(threads, int) and not isinstance(threads, bool):
        threads = [threads if d.type == "cpu" else 0 for d in devices]
    elif isinstance(threads, (str, bytes)) or not isinstance(threads, Sequence):
        raise TypeError(f"{who}: threads must be None, an int or one int per stage, got {threads!r}")
    threads = list(threads)
    if len(threads) != len(devices):
        raise ValueError(f"{who}: threads {threads} must give one count per stage ({len(devices)})")
    for stage, (n, device) in enumerate(zip(threads, devices)):
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"{who}: threads[{stage}] must be an int, got {n!r}")
        if device.type == "cpu" and not 1 <= n <= cpus:
            raise ValueError(f"{who}: threads[{stage}] = {n} for the CPU stage {stage}: expected 1 to {cpus} "
                             f"(this machine's CPUs)")
        if device.type != "cpu" and n < 0:
            raise ValueError(f"{who}: threads[{stage}] = {n}: expected a count >= 0")
    logger.info("%s: intra-op threads per stage %s", who, threads)
    return threads


def cap_threads(threads: Sequence[int], devices: Sequence[torch.device]) -> List[int]:
    """Thread budgets saved on another machine, for this one: each CPU stage
    1 to ``os.cpu_count()`` threads (a checkpoint saved on a machine with
    more CPUs loads here with this machine's count at most)."""
    cpus = os.cpu_count() or 1
    return [min(max(int(n), 1), cpus) if d.type == "cpu" else int(n) for n, d in zip(threads, devices)]


def place(units: Sequence[Unit], balance: Sequence[int], devices: Sequence[torch.device]) -> None:
    """Moves each unit's parameters to its stage's device, in place (the same
    Parameter objects: an optimizer made before or after steps them there),
    and records the device in ``Unit.device``."""
    stage_of = [s for s, b in enumerate(balance) for _ in range(b)]
    logger.info("placement: %s", "; ".join(f"stage {s} on {d}" for s, d in enumerate(devices)))
    with torch.no_grad():
        for u, s in zip(units, stage_of):
            u.device = devices[s]
            for name in u.param_names:
                if name is not None:
                    p = getattr(u.module, name)
                    if p.device != u.device:
                        p.data = p.data.to(u.device)
