"""Described clusters: presets for the machines people train on, and this one.

Every preset is a :class:`~pipelstm.simulator.Cluster` whose links are
*assumptions*, stated here and in :func:`describe` (which the cluster bench
writes into its JSON). The point-to-point figures are what NCCL's
send/receive reaches in practice, not the links' line rates:

* **NVLink 4 (H100 SXM, NVSwitch)**: 450 GB/s per direction per GPU on
  paper; 360 GB/s (80 %) and 10 µs per message are assumed for a
  point-to-point send, the level public nccl-tests runs report for large
  messages between two GPUs of one node (the ring all-reduce's bus
  bandwidth on 8 GPUs is reported at 460-480 GB/s with NVLink SHARP, so
  the ring model with 360 GB/s is on the slow side for large all-reduces).
* **InfiniBand NDR, one 400 Gb/s adapter per GPU** (GPUDirect RDMA): 50 GB/s
  line rate; 45 GB/s (90 %) and 15 µs per message assumed.
* **PCIe Gen5 x16 without NVLink**: 64 GB/s line rate; 40 GB/s and 15 µs
  assumed (public nccl-tests figures for 8 PCIe H100 are 35-45 GB/s).
* **Two stages on one GPU**: a device-to-device copy at 1.5 TB/s (half the
  HBM3 bandwidth: a read and a write) and 5 µs.

The local machine (CPU processes over gloo on loopback) is measured, not
assumed: :func:`measure_machine` times a gloo send/receive and an
all-reduce between two processes and fits latency and bandwidth to each,
what DDP's reducer adds to a step beside the all-reduce, and how much
the two slow each other down when both compute, and when they keep in
lock step.
"""

import os
from typing import Dict, NamedTuple, Optional, Sequence

from .model import Cluster, Link

__all__ = ["h100_node", "h100_cluster", "pcie_node", "local_machine", "measure_loopback", "measure_machine", "Machine",
           "describe", "PRESETS"]

GIB = 2.0 ** 30
H100_MEMORY = 80e9  # H100 SXM: 80 GB HBM3
NVLINK4 = Link(latency_s=10e-6, bytes_per_s=360e9)
IB_NDR = Link(latency_s=15e-6, bytes_per_s=45e9)
PCIE5 = Link(latency_s=15e-6, bytes_per_s=40e9)
SAME_GPU = Link(latency_s=5e-6, bytes_per_s=1.5e12)


def _positive_int(name: str, value, who: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{who}: {name} must be a positive int, got {value!r}")
    return value


def h100_node(gpus: int = 8) -> Cluster:
    """One H100 SXM node: ``gpus`` GPUs on NVLink 4 through NVSwitch.

    Args:
        gpus: GPUs of the node (1 to 8).

    Raises:
        ValueError: ``gpus`` is not an int between 1 and 8.
    """
    _positive_int("gpus", gpus, "h100_node")
    if gpus > 8:
        raise ValueError(f"h100_node: gpus must be at most 8 (an HGX H100 board), got {gpus}")
    return Cluster(nodes=1, devices_per_node=gpus, device="H100-SXM", device_memory=H100_MEMORY,
                   same_device=SAME_GPU, intra_node=NVLINK4, inter_node=IB_NDR)


def h100_cluster(nodes: int = 4) -> Cluster:
    """``nodes`` H100 SXM nodes of 8 GPUs, one InfiniBand NDR 400 Gb/s
    adapter per GPU between nodes.

    Raises:
        ValueError: ``nodes`` is not a positive int.
    """
    _positive_int("nodes", nodes, "h100_cluster")
    return Cluster(nodes=nodes, devices_per_node=8, device="H100-SXM", device_memory=H100_MEMORY,
                   same_device=SAME_GPU, intra_node=NVLINK4, inter_node=IB_NDR)


def pcie_node(gpus: int = 8) -> Cluster:
    """One node of ``gpus`` H100 PCIe cards (80 GB) without NVLink bridges:
    every transfer between GPUs crosses PCIe Gen5.

    Raises:
        ValueError: ``gpus`` is not a positive int.
    """
    _positive_int("gpus", gpus, "pcie_node")
    return Cluster(nodes=1, devices_per_node=gpus, device="H100-PCIe", device_memory=H100_MEMORY,
                   same_device=SAME_GPU, intra_node=PCIE5, inter_node=IB_NDR)


class Machine(NamedTuple):
    """What a machine's processes cost each other, as measured
    (:func:`measure_machine`, ``pipelstm.distributed.auto_layout.measure_job``):
    ``Cluster``'s fields of the same names."""

    link: Link
    allreduce: Optional[Link]
    compute_sharing: float
    replica_wait: float
    gradient_handling: Optional[Link]


def local_machine(processes: int = 2, link: Optional[Link] = None, memory: Optional[float] = None,
                  allreduce: Optional[Link] = None, compute_sharing: float = 1.0,
                  replica_wait: float = 1.0, gradient_handling: Optional[Link] = None) -> Cluster:
    """This machine as ``processes`` CPU processes talking over gloo on loopback.

    Args:
        processes: processes (ranks) on this machine.
        link: the loopback link between two processes; default: measured
            now (:func:`measure_machine`, a few seconds), with the
            all-reduce, the compute sharing, the replicas' wait and DDP's
            gradient handling, which then replace the arguments of those names.
        memory: bytes each process may use; default this machine's
            physical memory shared equally.
        allreduce: the measured all-reduce between two processes
            (``Cluster.allreduce``); None: a ring over ``link``.
        compute_sharing: how much longer compute takes beside other
            computing stages or processes (``Cluster.compute_sharing``).
        replica_wait: how much longer replicas' steps take in lock step
            (``Cluster.replica_wait``).
        gradient_handling: what DDP's reducer adds per step
            (``Cluster.gradient_handling``).

    Raises:
        ValueError: ``processes`` is not a positive int, ``memory`` not positive.
    """
    _positive_int("processes", processes, "local_machine")
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / processes
    if not memory > 0:
        raise ValueError(f"local_machine: memory must be positive bytes, got {memory!r}")
    if link is None:
        link, allreduce, compute_sharing, replica_wait, gradient_handling = measure_machine()
    # Two stages in one process hand over a tensor without a copy.
    return Cluster(nodes=1, devices_per_node=processes, device="cpu", device_memory=float(memory),
                   same_device=Link(latency_s=0.0, bytes_per_s=float("inf")), intra_node=link, inter_node=link,
                   allreduce=allreduce, compute_sharing=compute_sharing, replica_wait=replica_wait,
                   gradient_handling=gradient_handling)


SIZES = (4096, 1 << 20, 8 << 20, 32 << 20)


def _check_sizes(sizes: Sequence[int], repeats: int, who: str) -> None:
    if len(sizes) < 2 or repeats < 1:
        raise ValueError(f"{who}: needs two or more sizes and repeats >= 1, got {sizes}, {repeats}")


def measure_loopback(sizes: Sequence[int] = SIZES, repeats: int = 7) -> Link:
    """Times a gloo send/receive of each of ``sizes`` bytes between two CPU
    processes on this machine (the fastest of ``repeats`` round trips, halved)
    and fits ``latency + bytes / bandwidth``: the bandwidth by least squares,
    the latency from the smallest size.

    Raises:
        ValueError: fewer than two sizes, or ``repeats`` below 1.
        RuntimeError: the two processes failed, or the times are too noisy
            to fit (larger messages not slower).
    """
    _check_sizes(sizes, repeats, "measure_loopback")
    from .loopback import fit_link, pair_times

    return fit_link(list(sizes), pair_times(list(sizes), repeats, link_only=True)["one_way"], "measure_loopback")


def measure_machine(sizes: Sequence[int] = SIZES, repeats: int = 7, workload=None) -> Machine:
    """What two CPU processes on this machine cost each other, measured in
    two processes it spawns (gloo on loopback): the point-to-point link (as
    :func:`measure_loopback`), the all-reduce between them (the medians of
    ``repeats``, fitted the same way), what DDP's reducer adds to a step
    (``loopback.gradient_handling_times``, fitted alike), the compute
    sharing and the wait of replicas in lock step
    (``loopback.compute_sharing`` of the step
    ``workload()`` makes, a picklable function: e.g.
    ``functools.partial(calibrate.model_step, model, loss_fn, (t, b))`` for
    the model's own; default a small LSTM layer).

    Returns:
        A :class:`Machine` ``(link, allreduce, compute_sharing, replica_wait, gradient_handling)``.

    Raises:
        ValueError: fewer than two sizes, or ``repeats`` below 1.
        RuntimeError: the two processes failed, or the times are too noisy
            to fit (larger messages not slower).
    """
    _check_sizes(sizes, repeats, "measure_loopback")
    from .loopback import fit_link, pair_times

    times = pair_times(list(sizes), repeats, workload=workload)
    return Machine(fit_link(list(sizes), times["one_way"], "measure_loopback"),
                   fit_link(list(sizes), times["allreduce"], "measure_loopback (all-reduce)"),
                   float(times["sharing"]), float(times["wait"]),
                   fit_link(list(sizes), times["gradients"], "measure_machine (DDP's gradients)", clamp=True))


def describe(cluster: Cluster) -> Dict[str, object]:
    """The cluster as plain data (for JSON): sizes, memory, and each link's
    latency and bandwidth."""
    def link(l: Link) -> Dict[str, float]:
        return dict(latency_us=l.latency_s * 1e6, GB_per_s=l.bytes_per_s / 1e9)

    return dict(nodes=cluster.nodes, devices_per_node=cluster.devices_per_node, device=cluster.device,
                device_memory_GiB=cluster.device_memory / GIB, same_device=link(cluster.same_device),
                intra_node=link(cluster.intra_node), inter_node=link(cluster.inter_node),
                allreduce=None if cluster.allreduce is None else link(cluster.allreduce),
                compute_sharing=cluster.compute_sharing, replica_wait=cluster.replica_wait,
                gradient_handling=None if cluster.gradient_handling is None else link(cluster.gradient_handling))


# name: (builder, one line of assumptions), for the bench and the docs
PRESETS = {
    "h100x8": (h100_node, "1 node, 8 H100 SXM 80 GB, NVLink 4: 360 GB/s, 10 µs point-to-point (assumed)"),
    "h100x32": (h100_cluster, "4 nodes of 8 H100 SXM, NVLink 4 inside a node, InfiniBand NDR 400 Gb/s per GPU "
                              "between nodes: 45 GB/s, 15 µs (assumed)"),
    "pcie8": (pcie_node, "1 node, 8 H100 PCIe 80 GB, PCIe Gen5 between GPUs: 40 GB/s, 15 µs (assumed)"),
}
