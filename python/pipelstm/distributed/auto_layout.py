"""The automatic layout of a ``torchrun`` job: ``init_mesh(pp="auto")`` and
``PipelineParallel(chunks="auto", micro_batches="auto")``.

The model's units are calibrated on this machine (``pipelstm.simulator.
calibrate``), the link between two ranks, the all-reduce and how much
ranks computing at once slow each other down are measured over the job's
own process group, and ``pipelstm.simulator.layout.choose_layout`` picks the
fastest predicted dp x pp, balance, K x M and recomputation. Global rank 0
chooses and broadcasts the choice, so every rank runs the same one; rank 0
prints it with its predicted step time and why.
"""

import dataclasses
import functools
import logging
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["plan_layout", "measure_link", "measure_job", "engine_balance"]

logger = logging.getLogger(__name__)


def measure_link(sizes: Sequence[int] = (4096, 1 << 20, 8 << 20), repeats: int = 5):
    """The link between global ranks 0 and 1 of the initialised process
    group: a timed ping-pong of each of ``sizes`` bytes (the fastest of
    ``repeats`` round trips, halved), fitted as latency + bytes / bandwidth.
    A collective: every rank calls it (ranks past 1 only wait).

    Returns:
        A :class:`pipelstm.simulator.Link`, the same on every rank.
    """
    from ..simulator.loopback import fit_link, ping_pong
    from ..simulator.model import Link

    rank, world = dist.get_rank(), dist.get_world_size()
    times = ping_pong(rank, sizes, repeats) if world > 1 and rank <= 1 else []
    fitted = [None]
    if rank == 0:
        fitted = [fit_link(list(sizes), times, "measure_link", clamp=True) if times else Link(0.0, float("inf"))]
    dist.broadcast_object_list(fitted, src=0)
    return fitted[0]


def measure_job(sizes: Sequence[int] = (4096, 1 << 20, 8 << 20), repeats: int = 5, *, cpu: bool = True,
                step=None):
    """What the job's ranks cost each other: the link between ranks 0 and 1
    (:func:`measure_link`); over gloo, also the all-reduce over the whole
    group (medians of ``repeats``, fitted as latency + bytes / bandwidth),
    what DDP's reducer adds to a step (fitted alike) and, where the stages compute on the CPU (``cpu``), how much rank 0's
    compute slows while its machine's ranks compute beside it, and in lock
    step (``pipelstm.simulator.loopback.compute_sharing`` of ``step``, e.g.
    the model's own ``calibrate.model_step``; the wait of ``n`` ranks given
    as two replicas', ``Cluster.replica_wait_for``'s scale). A collective:
    every rank calls it.

    Returns:
        A :class:`pipelstm.simulator.clusters.Machine`, the same on every
        rank (``allreduce`` and the gradient handling None, sharing and
        wait 1.0 where not measured).
    """
    import os

    from ..simulator.clusters import Machine
    from ..simulator.loopback import allreduce_times, compute_sharing, fit_link, gradient_handling_times
    from ..simulator.model import rescaled_wait

    link = measure_link(sizes, repeats)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1 or dist.get_backend() != "gloo":
        return Machine(link, None, 1.0, 1.0, None)
    times, handling = allreduce_times(sizes, repeats), gradient_handling_times(sizes, repeats)
    local = min(int(os.environ.get("LOCAL_WORLD_SIZE", world)), world)  # torchrun: ranks 0..local-1 share rank 0's machine
    sharing, wait = compute_sharing(rank, range(local), repeats, step) if cpu else (1.0, 1.0)
    if local > 2:  # as two replicas' wait
        wait = rescaled_wait(wait, local, 2)
    fitted = [Machine(link, fit_link(list(sizes), times, "measure_job (all-reduce)", clamp=True), sharing, wait,
                      fit_link(list(sizes), handling, "measure_job (DDP's gradients)", clamp=True))
              if rank == 0 else None]
    dist.broadcast_object_list(fitted, src=0)
    return fitted[0]


def engine_balance(balance: Sequence[int], loss_inside: bool) -> list:
    """A layout's balance as the pipeline takes it: a loss computed inside
    the last stage (``loss_inside``), which the simulator counts as that
    stage's last unit, is not a unit of the pipeline."""
    out = list(balance)
    if loss_inside:
        out[-1] -= 1
    return out


def plan_layout(model: nn.Sequential, sample: Tuple[int, int], **options):
    """Plans the layout of ``model`` for steps of ``sample = (T, B)`` (B:
    the global batch, over all replicas) on the job's world.

    Args:
        model: the ``nn.Sequential`` every rank builds.
        sample: ``(T, B)`` of a training step.
        loss_fn: the ``nn.CrossEntropyLoss`` computed inside the last stage, if any.
        world_size: default: the initialised process group's.
        cluster: a :class:`pipelstm.simulator.Cluster`; default every rank
            on one machine (its CPU memory shared, or each rank's GPU memory),
            the link between ranks 0 and 1, the all-reduce, the compute
            sharing and the replicas' wait measured (:func:`measure_job`), the link standing
            for every link: give the cluster for several machines.
        costs: the units' costs; default calibrated now on ``device`` with
            ``threads`` (default this process's intra-op threads).
        pp, balance, chunks, micro_batches, checkpoint: fix what is not to be
            chosen (``balance`` as the pipeline takes it, without the loss;
            ``chunks``/``micro_batches``: an int, or the candidates).
        verbose: print the choice (on global rank 0).
        margin: how much faster a layout with more stages or items must be
            predicted to be taken over a simpler one
            (``pipelstm.simulator.layout.simplest``); default
            ``PLAN_MARGIN`` (10 %), the simulator's error measured on a CPU.

    Returns:
        A :class:`pipelstm.simulator.layout.LayoutChoice` (layout, prediction, why),
        the same on every rank; its balance counts the loss (if inside) in
        the last stage (:func:`engine_balance` gives the pipeline's).

    Raises:
        ValueError: a bad sample, or no layout for the world (named).
    """
    return choose_with_costs(model, sample, **options)[0]


def choose_with_costs(model: nn.Sequential, sample: Tuple[int, int], *, loss_fn: Optional[nn.Module] = None,
                    world_size: Optional[int] = None, cluster=None, costs=None, pp: Optional[int] = None,
                    balance: Optional[Sequence[int]] = None, chunks: Union[int, Sequence[int], None] = None,
                    micro_batches: Union[int, Sequence[int], None] = None, checkpoint: Optional[str] = None,
                    device: str = "cpu", threads: Optional[int] = None, verbose: bool = True,
                    margin: Optional[float] = None):
    """:func:`plan_layout`, and the unit costs it planned with (None on
    ranks other than 0, which receive the choice)."""
    if (not isinstance(sample, (tuple, list)) or len(sample) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sample)):
        raise ValueError(f"plan_layout: sample must be (T, B), two positive ints, got {sample!r}")
    T, B = sample
    shared = dist.is_available() and dist.is_initialized()
    world = world_size or (dist.get_world_size() if shared else None)
    if not world:
        raise ValueError("plan_layout: world_size is needed when torch.distributed is not initialised")
    if cluster is None:
        from ..simulator.calibrate import model_step
        from ..simulator.clusters import local_machine
        from ..simulator.clusters import measure_machine

        cpu = not device.startswith("cuda")
        size = (T, max(B // world, 1))  # every rank a replica: the most that computes at once
        if shared:
            measured = measure_job(cpu=cpu, step=model_step(model, loss_fn, size) if cpu else None)
        else:
            measured = measure_machine(workload=functools.partial(model_step, model, loss_fn, size))
        if not cpu:  # GPUs: what CPU processes cost each other does not apply
            measured = measured._replace(compute_sharing=1.0, replica_wait=1.0, gradient_handling=None)
        cluster = local_machine(world, **measured._asdict())
        if device.startswith("cuda"):  # a GPU per rank: its memory bounds the stage
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            cluster = dataclasses.replace(cluster, device=props.name, device_memory=float(props.total_memory))
    elif cluster.world_size != world:
        raise ValueError(f"plan_layout: the cluster has {cluster.world_size} devices, the world {world}")
    result = [None]
    if not shared or dist.get_rank() == 0:
        try:
            choice, costs = _choose(model, T, B, cluster, loss_fn, costs, pp, balance, chunks, micro_batches,
                                  checkpoint, device, threads, margin)
            result = [choice]
        except (ValueError, RuntimeError) as e:  # every rank stops with rank 0's reason
            if not shared:
                raise
            result = [e]
    if shared:
        dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], Exception):
        raise type(result[0])(str(result[0]))
    choice = result[0]
    logger.info("pipelstm.distributed: %s", choice.why)
    if verbose and (not shared or dist.get_rank() == 0):
        print(f"pipelstm.distributed: {choice.why}", flush=True)
    return choice, costs


def _choose(model, T, B, cluster, loss_fn, costs, pp, balance, chunks, micro_batches, checkpoint, device, threads,
            margin):
    """The choice and the costs it used (calibrated here unless given)."""
    from ..simulator import layout as search

    options = {}
    for name, value, default in (("chunks", chunks, search.CHUNKS),
                                 ("micro_batches", micro_batches, search.MICRO_BATCHES)):
        options[name] = default if value is None else ([value] if isinstance(value, int) else list(value))
    if costs is None:  # measured at every item size the search will ask for
        from ..simulator.calibrate import DEFAULT_SIZES, calibrate

        world = cluster if isinstance(cluster, int) else cluster.world_size
        sizes = search.search_sizes(T, B, world, **options)
        sizes += [s for s in DEFAULT_SIZES if s not in sizes][: max(0, 3 - len(sizes))]  # a fit needs three
        costs = calibrate(model, loss_fn=loss_fn, device=device, threads=threads or torch.get_num_threads(),
                          sizes=sizes)
    if balance is not None:  # given as the pipeline takes it: the loss goes with the last stage
        balance = list(balance)
        if costs.units() and costs.units()[-1].kind in search.LOSS_KINDS:
            balance[-1] += 1
    choice = search.choose_layout(costs, cluster, T, B, pp=pp, balance=balance,
                                checkpoints=[checkpoint] if checkpoint else search.CHECKPOINTS,
                                margin=search.PLAN_MARGIN if margin is None else margin, **options)
    return choice, costs


def resolve_auto(model: nn.Sequential, mesh, chunks, micro_batches, balance, checkpoint: str, loss_fn,
                 sample: Optional[Tuple[int, int]]) -> Tuple[int, int, Union[str, list]]:
    """``PipelineParallel``'s ``chunks="auto"`` / ``micro_batches="auto"``:
    the choice of ``init_mesh(pp="auto")`` where it is for this mesh and these
    settings, else one planned now for ``mesh.pp`` stages and ``sample``.
    Returns ``(chunks, micro_batches, balance)``, the same on every rank.

    Raises:
        ValueError: no choice to reuse and no ``sample``.
    """
    from ..pipeline.units import flatten

    fixed = None if isinstance(balance, str) else list(balance)
    choice = mesh.layout_choice
    reuse = (choice is not None and (choice.layout.dp, choice.layout.pp) == (mesh.dp, mesh.pp) and fixed is None
             and choice.layout.checkpoint == checkpoint and chunks in ("auto", choice.layout.chunks)
             and micro_batches in ("auto", choice.layout.micro_batches))
    if not reuse:
        if sample is None:
            raise ValueError("PipelineParallel: chunks='auto' or micro_batches='auto' needs sample=(T, B), a step's "
                             "length and global batch, or a mesh from init_mesh(pp='auto', ...) to take them from")
        choice, _ = choose_with_costs(model, sample, loss_fn=loss_fn, costs=mesh.layout_costs, pp=mesh.pp,
                                      balance=fixed, chunks=None if chunks == "auto" else chunks,
                                      checkpoint=checkpoint,
                                      micro_batches=None if micro_batches == "auto" else micro_batches,
                                      device=mesh.device.type)
    units = len(flatten(model.named_children()))
    split = fixed or engine_balance(choice.layout.balance, sum(choice.layout.balance) > units)
    return (choice.layout.chunks if chunks == "auto" else chunks,
            choice.layout.micro_batches if micro_batches == "auto" else micro_batches, split)

