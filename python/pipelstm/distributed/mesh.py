"""The 2-D layout of data-parallel x pipeline ranks, from torchrun's environment.

The layout is a ``torch.distributed.device_mesh.DeviceMesh`` of shape
``(dp, pp)``, dimensions ``("dp", "pp")``: its ``"pp"`` groups are the
pipelines, its ``"dp"`` groups the replicas of each stage.
"""

import contextlib
import datetime
import inspect
import os
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .backend_threads import outlive_the_backend, released_by_the_backend

__all__ = ["Mesh", "init_mesh"]


@dataclass
class Mesh:
    """Where this process sits: global rank ``dp_rank * pp + pp_rank``.

    ``pp_group`` holds the ``pp`` stages of this process's pipeline (its
    group rank is the stage index); ``dp_group`` holds the ``dp`` replicas of
    this process's stage, over which gradients are averaged. Both are the
    groups of ``device_mesh``, the ``(dp, pp)`` DeviceMesh with dimensions
    ``("dp", "pp")`` (``device_mesh["pp"]``, ``device_mesh["dp"]``), for
    torch's own parallelisms (DTensor, FSDP) over the same layout.
    """

    rank: int
    world_size: int
    local_rank: int
    dp: int
    pp: int
    dp_rank: int
    pp_rank: int
    pp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    pp_ranks: List[int]  # global ranks of this pipeline's stages, in stage order
    dp_ranks: List[int]  # global ranks of this stage's replicas
    device: torch.device
    backend: str
    timeout: float  # seconds, for every collective and point-to-point operation
    device_mesh: Optional[DeviceMesh] = None  # the (dp, pp) DeviceMesh whose groups these are
    layout_choice: Any = None  # init_mesh(pp="auto"): the simulator's LayoutChoice (layout, prediction, why)
    layout_costs: Any = None  # and the unit costs it chose with (global rank 0 only)

    @property
    def is_first_stage(self) -> bool:
        """Whether this rank holds its pipeline's first stage (pp rank 0)."""
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank holds its pipeline's last stage (pp rank pp - 1)."""
        return self.pp_rank == self.pp - 1

    def neighbours(self, first_stage: int, local_stages: int) -> Tuple[Optional[object], Optional[object]]:
        """The engine's links (``RemoteSpec``) to the processes holding the
        stage before this rank's ``local_stages`` stages (numbered from
        ``first_stage``) and the stage after them; None at either end."""
        from .._C import pipeline as engine

        def link(pp_rank: int, stage: int):
            return engine.RemoteSpec(self.pp_group.group_name, pp_rank,
                                     f"stage {stage} (rank {self.pp_ranks[pp_rank]})")

        return (None if self.is_first_stage else link(self.pp_rank - 1, first_stage - 1),
                None if self.is_last_stage else link(self.pp_rank + 1, first_stage + local_stages))

    def peer_name(self, rank: int) -> str:
        """A global rank as the pipeline's errors name it, e.g. ``"stage 1 (rank 1)"``."""
        return f"stage {rank % self.pp} (rank {rank})"

    @contextlib.contextmanager
    def waiting_for(self, what: str, peers: Sequence[int], holding: Sequence[torch.Tensor] = ()) -> Iterator[None]:
        """Runs a collective (the ``with`` body) that waits on the global
        ranks ``peers``; its failure becomes an error naming this stage, the
        operation, the peers and the timeout, as the pipeline's point-to-point
        transfers name theirs. E.g. ``with mesh.waiting_for("the loss broadcast
        from", [1], holding=[t]): dist.broadcast(t, ...)``.

        ``holding``: the collective's tensors, which Python alone holds
        before it. It returns only once the backend has let go of them too
        (see ``backend_threads.released_by_the_backend``).

        Raises:
            RuntimeError: the collective failed (a dead peer) or timed out (a
                stopped one): ``"pipelstm.distributed: stage 0 (rank 0) timed
                out after 30 s waiting for the loss broadcast from stage 1
                (rank 1); is it alive? (<the backend's words>)"``.
        """
        try:
            yield
            released_by_the_backend(holding, self.timeout)
        except RuntimeError as e:
            outlive_the_backend(e.__traceback__)
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            peers_named = ", ".join(self.peer_name(r) for r in peers)
            head = f"pipelstm.distributed: {self.peer_name(self.rank)} "
            if "imed out" in why:  # gloo: "Timed out waiting ..."; NCCL's watchdog: "timed out"
                raise RuntimeError(f"{head}timed out after {self.timeout:g} s waiting for {what} {peers_named}; "
                                   f"is it alive? ({why})") from e
            raise RuntimeError(f"{head}failed waiting for {what} {peers_named} ({why})") from e

    def others(self, ranks: Sequence[int]) -> List[int]:
        """``ranks`` without this process's."""
        return [r for r in ranks if r != self.rank]

    def share_loss(self, value: Optional[torch.Tensor]) -> torch.Tensor:
        """The last stage's loss ``value`` (None on the other stages) on every
        rank, averaged over the replicas: a 0-dim float64 CPU tensor. A
        collective over every rank."""
        t = torch.zeros((), dtype=torch.float64, device=self.device)
        if value is not None:
            t.fill_(float(value))
        if self.pp > 1:
            last = self.pp_ranks[-1]
            what = "the loss broadcast to" if self.is_last_stage else "the loss broadcast from"
            with self.waiting_for(what, self.others(self.pp_ranks) if self.is_last_stage else [last], holding=[t]):
                dist.broadcast(t, src=last, group=self.pp_group)
        if self.dp > 1:
            with self.waiting_for("the loss all-reduce with", self.others(self.dp_ranks), holding=[t]):
                dist.all_reduce(t, group=self.dp_group)
            t /= self.dp
        return t.cpu()

    def gather_first_replica(self, make) -> Optional[List[Any]]:
        """``make()`` of every stage of the first replica, in rank order, on
        global rank 0 (None elsewhere); a collective over every rank."""
        mine = make() if self.dp_rank == 0 else None
        parts = [None] * self.world_size if self.rank == 0 else None
        peers = self.others(range(self.world_size)) if self.rank == 0 else [0]
        with self.waiting_for("the gather of the first replica's stages with", peers):
            dist.gather_object(mine, parts, dst=0)
        return None if parts is None else [p for p in parts if p is not None]

    def shard(self, batch: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This replica's part of a global batch (``torch.tensor_split`` along
        ``dim``, the batch dimension of time-major data)."""
        if batch.size(dim) < self.dp:
            raise ValueError(f"Mesh.shard: a batch of {batch.size(dim)} along dim {dim} cannot feed "
                             f"dp={self.dp} replicas")
        return torch.tensor_split(batch, self.dp, dim=dim)[self.dp_rank]

    def replicate(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` replicated over this rank's data-parallel group with
        ``DistributedDataParallel``, or ``module`` itself where dp = 1. Its
        buffers are not synced before each forward (a pipeline stage holds none)."""
        if self.dp == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel

        # torch 2.13 renames the switch and deprecates the old name
        renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        no_sync = dict(forward_sync_buffers=False) if renamed else dict(broadcast_buffers=False)
        return DistributedDataParallel(module, process_group=self.dp_group, **no_sync)

    def __str__(self) -> str:
        return (f"rank {self.rank}/{self.world_size}: stage {self.pp_rank} of {self.pp}, replica {self.dp_rank} "
                f"of {self.dp} ({self.backend}, {self.device})")


def _env_int(name: str, default: Optional[int] = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise RuntimeError(
                f"pipelstm.distributed.init_mesh: ${name} is not set; launch with torchrun "
                "(e.g. torchrun --nproc-per-node=2 train.py) or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
            )
        return default
    return int(value)


def _pick(device: Optional[str], backend: Optional[str], local_rank: int, local_world: int):
    """(backend, device) from what was asked and what this machine has."""
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"pipelstm.distributed.init_mesh: device must be 'cpu', 'cuda' or None, got {device!r}")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"pipelstm.distributed.init_mesh: backend must be 'gloo', 'nccl' or None, got {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" and gpus == 0:
        raise ValueError("pipelstm.distributed.init_mesh: device='cuda', but no GPU is visible here")
    if backend == "nccl" and gpus < local_world:
        raise ValueError(f"pipelstm.distributed.init_mesh: backend='nccl' needs a GPU per process: {local_world} "
                         f"processes on this machine, {gpus} GPU(s) (NCCL refuses two ranks on one device); use "
                         "backend='gloo', which shares a GPU through host copies")
    if device is None:
        device = "cuda" if gpus and (backend == "nccl" or (backend is None and gpus >= local_world)) else "cpu"
    if backend is None:
        backend = "nccl" if device == "cuda" and gpus >= local_world else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ValueError("pipelstm.distributed.init_mesh: backend='nccl' carries GPU tensors only; use "
                         "device='cuda' or backend='gloo'")
    return backend, (torch.device("cuda", local_rank % gpus) if device == "cuda" else torch.device("cpu"))


def init_mesh(pp: Union[int, str] = 1, *, dp: Optional[int] = None, backend: Optional[str] = None,
              device: Optional[str] = None, timeout: float = 1800.0, model=None,
              sample: Optional[Tuple[int, int]] = None, loss_fn=None, costs=None) -> Mesh:
    """Initialises ``torch.distributed`` from torchrun's environment (unless
    already initialised) and builds the dp x pp layout.

    Args:
        pp: pipeline stages (processes per pipeline), or ``"auto"``: the
            fastest layout the simulator predicts for ``model`` on this
            world (:func:`pipelstm.distributed.plan_layout`: the units
            calibrated on this machine, the link between ranks measured),
            planned on rank 0, printed there, and kept as ``mesh.layout_choice`` for
            ``PipelineParallel(chunks="auto", micro_batches="auto")``.
        dp: data-parallel replicas; default ``world_size // pp``.
        model, sample, loss_fn, costs: with ``pp="auto"``: the
            ``nn.Sequential`` every rank builds, ``(T, B)`` of a step (B the
            global batch), the loss computed inside the last stage (if any),
            and optionally the units' costs (instead of calibrating).
        backend: ``"nccl"`` or ``"gloo"``; default NCCL where each process
            on this machine has a GPU of its own, gloo otherwise.
        device: ``"cuda"`` or ``"cpu"``, where this process's stage
            computes; default the GPU of its local rank where the backend is
            NCCL, else the CPU. ``device="cuda"`` with fewer GPUs than
            processes on a machine shares them (local rank modulo GPUs) over
            gloo, whose point-to-point transfers then go through host copies.
        timeout: seconds any collective or point-to-point operation may wait
            before the run fails (instead of hanging on a dead or stopped peer).

    Returns:
        This process's :class:`Mesh`; its ``device_mesh`` is the ``(dp, pp)``
        DeviceMesh (dimensions ``"dp"``, ``"pp"``) whose groups it uses.

    Every process checks the layout before the process group forms and, on
    a bad one, waits for the others to reach the same check (at most
    ``timeout``), so every rank stops with the same message.
    """
    if dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        world, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
    auto = pp == "auto"
    problem = _layout_problem(pp, dp, world, timeout, auto, model, sample)
    if problem:
        _stop_every_rank(f"pipelstm.distributed.init_mesh: {problem}", rank, world, timeout)
    if auto:
        pp = 1  # a layout of one stage until the choice replaces it
    if dp is None:
        dp = world // pp
    local_rank = _env_int("LOCAL_RANK", 0)
    backend, device = _pick(device, backend, local_rank, _env_int("LOCAL_WORLD_SIZE", 1))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    td = datetime.timedelta(seconds=timeout)
    if not dist.is_initialized():
        # After `torchrun --max-restarts` restarts the workers, the store can
        # still hold the dead attempt's addresses (gloo then connects to a
        # dead process); keys under a per-attempt prefix cannot be stale.
        store, _, _ = next(dist.rendezvous("env://", timeout=td))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"pipelstm/attempt-{attempt}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=td,
                                device_id=device if backend == "nccl" else None)
    choice = choice_costs = None
    if auto:  # every rank gets rank 0's layout choice
        from .auto_layout import choose_with_costs

        choice, choice_costs = choose_with_costs(model, sample, loss_fn=loss_fn, costs=costs, device=device.type)
        dp, pp = choice.layout.dp, choice.layout.pp
    # Global rank dp_rank * pp + pp_rank: row dp_rank, column pp_rank. Every
    # group gets the backend and timeout asked for (DeviceMesh would reuse the
    # default group for a dimension spanning the world, or use its defaults).
    options = {name: (backend, _group_options(backend, td)) for name in ("dp", "pp")}
    device_mesh = init_device_mesh(device.type, (dp, pp), mesh_dim_names=("dp", "pp"), backend_override=options)
    dp_rank, pp_rank = rank // pp, rank % pp
    return Mesh(rank=rank, world_size=world, local_rank=local_rank, dp=dp, pp=pp, dp_rank=dp_rank,
                pp_rank=pp_rank, pp_group=device_mesh.get_group("pp"), dp_group=device_mesh.get_group("dp"),
                pp_ranks=[dp_rank * pp + s for s in range(pp)], dp_ranks=[d * pp + pp_rank for d in range(dp)],
                device=device, backend=backend, timeout=float(timeout), device_mesh=device_mesh,
                layout_choice=choice, layout_costs=choice_costs)


def _layout_problem(pp, dp, world: int, timeout: float, auto: bool, model, sample) -> Optional[str]:
    """What is wrong with the layout asked for, or None."""
    if auto and (model is None or sample is None or dp is not None):
        return "pp='auto' needs model= and sample=(T, B) (the global batch) to plan for, and no dp (the plan chooses it)"
    if not auto and (not isinstance(pp, int) or pp < 1):
        return f"pp must be a positive int or 'auto', got {pp!r}"
    stages = 1 if auto else pp
    if world % stages != 0:
        return f"the world size {world} is not divisible by pp={stages}; launch a multiple of {stages} processes"
    if dp is not None and dp * stages != world:
        return f"dp={dp} x pp={stages} = {dp * stages} processes, but the world size is {world}"
    if not timeout > 0:
        return f"timeout must be positive, got {timeout}"
    return None


def _stop_every_rank(message: str, rank: int, world: int, timeout: float):
    """Raises ``ValueError(message)`` once every rank has reached the same
    check (or after ``timeout``): torchrun stops the other processes as soon
    as one exits, so a rank that raised at once would leave slower ones
    (still importing) to die without saying why."""
    if world > 1 and not dist.is_initialized() and "MASTER_ADDR" in os.environ:
        td = datetime.timedelta(seconds=timeout if timeout > 0 else 60.0)
        try:
            store, _, _ = next(dist.rendezvous("env://", timeout=td))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            key = f"pipelstm/attempt-{attempt}/stopped"
            store.set(f"{key}/{rank}", "1")
            store.wait([f"{key}/{r}" for r in range(world)], td)
        except Exception:  # noqa: BLE001 - a peer that never came (or a gone store) must not hide the reason
            pass
    elif world > 1 and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()
    raise ValueError(message)


def _group_options(backend: str, timeout: datetime.timedelta):
    """The backend's process group options with ``timeout``."""
    options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    return options
