"""What the pipeline simulator takes and gives.

A *cluster* (``Cluster``: GPUs or CPU sockets per node, the links between
them) runs a model's *units* (``UnitCosts``: what each unit costs on one
device, for an item of ``t`` steps by ``b`` sequences) in a *layout*
(``Layout``: dp x pp, the units per stage, K chunks x M micro-batches,
recomputation). The simulator plays the engine's schedule over them and
returns a ``Prediction``: step time, bubble, per-stage peak memory and the
timeline the engine would draw.

Ranks are placed as ``pipelstm.distributed.init_mesh`` places them: global
rank ``dp_rank * pp + pp_rank``, ``gpus_per_node`` consecutive ranks a node,
so a pipeline's stages are neighbours and its replicas far apart.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence

__all__ = ["Link", "Cluster", "UnitInfo", "UnitCosts", "Layout", "Prediction", "PHASES"]

# The per-item phases a unit's cost is given for: "forward" (also what a
# recomputation replays), "backward" (the data gradients), "weights" (its
# parameter gradients, once per pass, for the whole sequence).
PHASES = ("forward", "backward", "weights")


@dataclass(frozen=True)
class Link:
    """A point-to-point connection: ``seconds(n) = latency_s + n / bytes_per_s``."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        """The time to move ``nbytes`` over this link (0 bytes: free)."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Cluster:
    """Nodes of devices and the links between them.

    Args:
        nodes: machines.
        devices_per_node: GPUs (or CPU processes) per machine.
        device: a name for the device, e.g. ``"H100-SXM"`` or ``"cpu"``.
        device_memory: bytes of memory per device.
        same_device: a hand-over between two stages on one device.
        intra_node: between two devices of one node (NVLink, PCIe, loopback).
        inter_node: between two nodes (the network).
        allreduce: a measured all-reduce between two devices of one node
            (``seconds(bytes)``), where the collective costs more than a
            ring of sends over ``intra_node`` (gloo reduces and copies on
            the CPU); ranks of one node then take it, scaled as a ring:
            ``(n-1) * latency + 2(n-1)/n * bytes / bandwidth``. None: the
            ring over the links.
        compute_sharing: how much longer a stage's compute takes while
            another stage or replica computes on the same node: 1.0 where
            devices are independent (GPUs); above 1 where they share cores,
            caches and memory bandwidth (a CPU's processes and threads).
        replica_wait: how much longer a step of two data-parallel replicas
            takes because each step waits for the slower one (a replica's
            compute varies from step to step): their steps in lock step over
            the same steps side by side, measured; ``n`` replicas wait for
            the slowest of ``n`` (:meth:`replica_wait_for`). 1.0: steps that
            do not vary (assumed for GPUs).
        gradient_handling: what DDP's reducer adds to a replica's step
            beside the all-reduce, for a stage's gradient bytes (copying
            them into its buckets and back, its hooks), as latency + bytes /
            bandwidth; measured on a CPU. None: nothing (GPUs copy at device
            bandwidth).
    """

    nodes: int
    devices_per_node: int
    device: str
    device_memory: float
    same_device: Link
    intra_node: Link
    inter_node: Link
    allreduce: Optional[Link] = None
    compute_sharing: float = 1.0
    replica_wait: float = 1.0
    gradient_handling: Optional[Link] = None

    def __post_init__(self) -> None:
        if not self.compute_sharing >= 1.0:
            raise ValueError(f"Cluster: compute_sharing must be at least 1.0 (1.0: independent devices), got "
                             f"{self.compute_sharing!r}")
        if not self.replica_wait >= 1.0:
            raise ValueError(f"Cluster: replica_wait must be at least 1.0 (1.0: steps that do not vary), got "
                             f"{self.replica_wait!r}")

    def replica_wait_for(self, n: int) -> float:
        """The stretch of a step of ``n`` replicas in lock step: the
        measured two replicas' excess, scaled by how far the slowest of
        ``n`` normal samples lies above their mean against the slower of two."""
        return rescaled_wait(self.replica_wait, 2, n) if n > 1 else 1.0

    @property
    def world_size(self) -> int:
        """All devices of the cluster."""
        return self.nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        """The node global rank ``rank`` runs on."""
        return rank // self.devices_per_node

    def link(self, a: int, b: int) -> Link:
        """The link from global rank ``a`` to ``b``."""
        if a == b:
            return self.same_device
        return self.intra_node if self.node_of(a) == self.node_of(b) else self.inter_node

    def gradient_seconds(self, replicas: int, nbytes: float) -> float:
        """What DDP adds to a step of ``replicas`` for ``nbytes`` of
        gradients besides the all-reduce (``gradient_handling``; none for
        one replica, which DDP does not wrap)."""
        if replicas <= 1 or nbytes <= 0 or self.gradient_handling is None:
            return 0.0
        return self.gradient_handling.seconds(nbytes)

    def allreduce_seconds(self, ranks: Sequence[int], nbytes: float) -> float:
        """An all-reduce of ``nbytes`` over ``ranks``: the measured one
        (``allreduce``) where they share a node, else a ring: 2(n-1) steps,
        each moving nbytes/n over the slowest link of the ring."""
        n = len(ranks)
        if n <= 1 or nbytes <= 0:
            return 0.0
        if self.allreduce is not None and len({self.node_of(r) for r in ranks}) == 1:
            return (n - 1) * self.allreduce.latency_s + 2 * (n - 1) / n * nbytes / self.allreduce.bytes_per_s
        slowest = max((self.link(ranks[i], ranks[(i + 1) % n]) for i in range(n)),
                      key=lambda l: l.seconds(nbytes / n))
        return 2 * (n - 1) * slowest.seconds(nbytes / n)


def expected_max_of_normals(n: int) -> float:
    """The mean of the largest of ``n`` standard normal samples (0 for one,
    1/sqrt(pi) for two), by the midpoint rule over [-10, 10]."""
    steps, lo, hi = 4000, -10.0, 10.0
    dx = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        x = lo + (i + 0.5) * dx
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        total += x * n * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1) * dx
    return total


def rescaled_wait(wait: float, measured_for: int, n: int) -> float:
    """A lock-step wait measured for ``measured_for`` replicas, for ``n``:
    its excess over 1 scaled by how far the slowest of ``n`` normal samples
    lies above their mean against the slowest of ``measured_for``."""
    return 1.0 + (wait - 1.0) * expected_max_of_normals(n) / expected_max_of_normals(measured_for)


@dataclass(frozen=True)
class UnitInfo:
    """One unit as the simulator sees it (the engine's units, the loss last)."""

    name: str
    kind: str  # the engine's UnitKind name: "lstm", "linear", "cross_entropy", ...
    param_bytes: int  # its parameters (their gradients and the optimizer's state come on top)
    state_bytes_per_row: int = 0  # an LSTM layer: its (h, c) per sequence, carried between chunks


class UnitCosts(Protocol):
    """What each unit of one model costs on one kind of device.

    Optional, read where present: ``pass_gap_s`` (seconds between a
    stage's forward pass and its backward, outside the engine),
    ``step_overhead_s`` (the rest of a step outside the passes) and
    ``first_saved_bytes(unit, t, b)`` (what the unit keeps as the first of
    a stage on a device of its own, its input included, where
    ``saved_bytes`` counts only what it adds to the unit before it).
    """

    device: str

    def units(self) -> Sequence[UnitInfo]:
        """The units in order."""

    def seconds(self, unit: int, phase: str, t: int, b: int) -> float:
        """Seconds of ``phase`` (one of ``PHASES``) of unit ``unit`` for an
        item of ``t`` steps by ``b`` sequences ("weights": for the whole pass
        of ``t`` steps by ``b``)."""

    def output_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes of the unit's output for the item (what a stage ending
        with it hands on; the gradient coming back has the same size)."""

    def saved_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes the unit's forward keeps for its backward, for the item."""


@dataclass(frozen=True)
class Layout:
    """How a model is laid out and scheduled.

    ``balance`` gives the units per pipeline stage (``pp`` entries summing
    to the units, the loss included in the last).
    """

    dp: int
    pp: int
    balance: Sequence[int]
    chunks: int
    micro_batches: int
    checkpoint: str = "never"  # as pipelstm.Pipeline: "never", "except_last", "always"
    # The pp stages of a replica are one engine in one process (pipelstm.Pipeline,
    # LSTM(devices=)) rather than a process each (PipelineParallel): the backward
    # starts after the whole forward and, on the CPU, stages share the weight tasks.
    in_process: bool = False


@dataclass
class Prediction:
    """What the simulator predicts for one training step (forward,
    backward, the data-parallel all-reduce; no optimizer step).

    ``events`` are in the engine's trace format (``Pipeline.trace``), so
    ``pipelstm.timeline.write_timeline`` draws them like a measured run.
    """

    layout: Layout
    step_s: float
    forward_s: float
    backward_s: float
    allreduce_s: float  # what the all-reduce adds after the backward (its exposed part)
    bubble: float  # idle fraction of the stages over the forward and backward passes
    stage_peak_bytes: List[float]  # per stage: parameters, gradients, kept activations, in flight
    events: List[Dict[str, object]] = field(default_factory=list)
    # per process of one replica (one for an in-process layout, else one per
    # stage): the most its stages hold at once
    process_peak_bytes: List[float] = field(default_factory=list)
    notes: Optional[str] = None

    def timeline(self, path: str) -> Dict[str, object]:
        """Writes the predicted schedule as a Chrome trace and Gantt chart
        (``pipelstm.timeline.write_timeline``)."""
        from ..timeline import write_timeline

        return write_timeline(self.events, [f"stage {s}" for s in range(self.layout.pp)], path)
