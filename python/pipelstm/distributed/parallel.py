"""``PipelineParallel``: one pipeline stage per process, replicated with DDP.

Every process builds the whole model (same definition, same seed), then
keeps the units of its stage: the partition of the units into ``pp`` stages
is the same on every rank (the FLOP cost model, or a given ``balance``), and
is checked to be. The stage runs in the C++ engine, whose first and last
stage exchange activations and gradients with the neighbouring processes
point-to-point (posted ahead, chunk by chunk), and is wrapped in
``DistributedDataParallel`` over the data-parallel group.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..pipeline import PipelineCore
from ..pipeline.balance import partition, resolve_balance
from ..pipeline.packed import sort_states, stage_input
from ..pipeline.prologue import prepare
from ..timeline import write_timeline
from .agreement import check_same_everywhere
from .mesh import Mesh
from .auto_layout import resolve_auto

__all__ = ["PipelineParallel"]


class _Stage(nn.Module):
    """This process's units as a module: their parameters (the model's own
    Parameter objects, for DDP) and the core that runs them."""

    def __init__(self, core: PipelineCore, global_names: List[str], input_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weights = nn.ParameterList([p for u in core.units for p in u.params() if p is not None])
        self.global_names = global_names
        self.core = core
        self._input_features, self._dtype = input_features, dtype

    def forward(self, input: Tensor, h0: List[Optional[Tensor]], c0: List[Optional[Tensor]],
                target: Optional[Tensor] = None, batch_sizes: Optional[Tensor] = None):
        return self.core.run(input, h0, c0, self.training, target, batch_sizes)


class PipelineParallel(nn.Module):
    """A sequential LSTM model split into ``mesh.pp`` stages, one per
    process, each replicated over ``mesh.dp`` processes with DDP.

    Args:
        model: the whole ``nn.Sequential`` (Embedding, LSTM layers, Dropout,
            Linear), built the same way on every rank.
        mesh: from :func:`pipelstm.distributed.init_mesh`.
        chunks, micro_batches: K time chunks x M micro-batches per step, or
            ``"auto"``: the simulator's choice (the plan of
            ``init_mesh(pp="auto")``, else one for ``sample``; see
            :func:`pipelstm.distributed.plan_layout`).
        sample: ``(T, B)`` of a step (B: the global batch), for ``"auto"``.
        balance: ``"auto"`` (FLOP cost model) or the unit count per stage.
        devices: this process's devices (default ``[mesh.device]``); several
            make this process's stage an in-process pipeline of its own.
        threads: intra-op threads per local CPU stage.
        carry_state: keep each LSTM layer's final state as the next step's
            initial state (truncated BPTT), detached; :meth:`reset_state`
            starts again from zeros.
        checkpoint: activation recomputation, as in :class:`pipelstm.Pipeline`
            (``"never"``, ``"except_last"``, ``"always"``).
        loss_fn: an ``nn.CrossEntropyLoss`` computed inside the last stage,
            item by item, as in :class:`pipelstm.Pipeline`; ``train_step`` and
            ``eval_step`` then take no ``loss_fn`` of their own.

    ``parameters()`` are this stage's; give them to the optimizer.
    ``state_dict()`` has the unsplit model's names for this stage's
    parameters; :meth:`consolidated_state_dict` gathers the whole model.
    """

    def __init__(self, model: nn.Sequential, mesh: Mesh, *, chunks: Union[int, str] = 1,
                 micro_batches: Union[int, str] = 1, balance: Union[str, Sequence[int]] = "auto",
                 devices: Optional[Sequence] = None, threads: Union[None, int, Sequence[int]] = None,
                 carry_state: bool = True, checkpoint: str = "never", loss_fn: Optional[nn.Module] = None,
                 sample: Optional[Tuple[int, int]] = None) -> None:
        super().__init__()
        if not isinstance(model, nn.Sequential):
            raise ValueError(f"PipelineParallel: expected an nn.Sequential, got {type(model).__name__}")
        if "auto" in (chunks, micro_batches):
            chunks, micro_batches, balance = resolve_auto(model, mesh, chunks, micro_batches, balance, checkpoint,
                                                          loss_fn, sample)
        prepared = prepare("PipelineParallel", model.named_children(), chunks=chunks, micro_batches=micro_batches,
                           checkpoint=checkpoint, loss_fn=loss_fn)
        self._loss = prepared.loss
        self.mesh = mesh
        units = prepared.units
        n = len(units)
        if mesh.pp > n:
            raise ValueError(f"PipelineParallel: pp={mesh.pp} stages but the model has only {n} units "
                             f"({', '.join(u.name for u in units)}); use pp <= {n}")
        self.balance = resolve_balance(balance, units, mesh.pp, "PipelineParallel")
        start = sum(self.balance[: mesh.pp_rank])
        mine = units[start : start + self.balance[mesh.pp_rank]]
        local_devices = [torch.device(d) for d in (devices or [mesh.device])]
        if len(local_devices) > len(mine):
            raise ValueError(f"PipelineParallel: {len(local_devices)} devices for stage {mesh.pp_rank}, which has "
                             f"only {len(mine)} units")
        local_balance = partition([u.cost for u in mine], len(local_devices))
        # The same model, plan and settings on every rank, or every rank stops here.
        first_stage = check_same_everywhere(model, units, self.balance, chunks, micro_batches,
                                             len(local_devices), mesh)
        self.first_stage, self.num_local_stages = first_stage, len(local_devices)
        self.devices = local_devices
        core = PipelineCore(mine, local_devices, local_balance, threads, chunks=chunks, micro_batches=micro_batches,
                            checkpoint=checkpoint, loss=self._loss if mesh.is_last_stage else None,
                            who="PipelineParallel")
        self.threads = core.threads
        core.connect(*mesh.neighbours(first_stage, len(local_devices)), mesh.timeout, first_stage, start,
                     f"rank {mesh.rank}")
        names = {id(p): name for name, p in model.named_parameters()}
        global_names = [names[id(p)] for ps in (u.params() for u in mine) for p in ps if p is not None]
        in_features = 0 if mesh.is_first_stage else _width_after(units[:start])
        dtype = next(p for u in mine for p in u.params() if p is not None).dtype
        self._local = _Stage(core, global_names, in_features, dtype)
        self._local.train(model.training)
        self.stage = mesh.replicate(self._local)
        self.carry_state = carry_state
        self._hidden: Optional[Tuple[List[Tensor], List[Tensor]]] = None
        self._stage_names: Optional[List[str]] = None

    # --- running -------------------------------------------------------------------

    @property
    def core(self) -> PipelineCore:
        """This process's :class:`PipelineCore`: its local stages' units and
        engine, ``trace()`` (local stage numbers) and ``saved_activation_bytes``."""
        return self._local.core

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank holds the last stage (the one that returns the output or the loss)."""
        return self.mesh.is_last_stage

    @property
    def computes_loss(self) -> bool:
        """Whether the loss runs inside the pipeline (``loss_fn`` given at construction)."""
        return self._loss is not None

    def reset_state(self) -> None:
        """Start the next step from zero LSTM states (a new sequence)."""
        self._hidden = None

    def forward(self, input: Union[Tensor, PackedSequence], target=None) -> Union[None, Tensor, PackedSequence]:
        """The pipelined forward of this replica's batch ``input`` ([T, B]
        indices, the same tensor, or at least the same shape, on every stage;
        or a ``PackedSequence``, the same on every stage, run without padding).
        Returns the model output on the last stage (with ``loss_fn``: the
        loss of ``target`` [T, B], packed: packed like it or its data [N], which
        only the last stage reads), an empty placeholder elsewhere.

        Raises:
            ValueError, RuntimeError: before any work, on the rank that
                reads it: an input the model's first unit cannot take (dims,
                feature size, dtype; checked on the first stage), a target
                that is missing or not int64 indices of the input's shape
                (the last stage, with ``loss_fn``). The other stages then
                fail waiting for it (an error naming that stage and rank).
        """
        local, seq = self._local, input if isinstance(input, PackedSequence) else None
        loss_here = self._loss is not None and self.mesh.is_last_stage
        if seq is not None:
            x, target = stage_input(local.core, seq, target, self.mesh.is_first_stage, loss_here, self.devices[0],
                                    local._input_features, local._dtype)
            B = int(seq.batch_sizes[0])
        else:
            if not isinstance(input, Tensor) or input.dim() < 2:
                raise ValueError(f"PipelineParallel: expected input of shape [T, B, ...], got "
                                 f"{getattr(input, 'shape', type(input).__name__)}")
            T, B = input.shape[0], input.shape[1]
            if self.mesh.is_first_stage:  # what the model's first unit reads (the others use only T and B)
                local.core.check_input(input)
            if loss_here:
                local.core.check_target(target, T, B)
            x = input.to(self.devices[0]) if self.mesh.is_first_stage else None
            if x is None:  # only the shape: the activations come from the previous stage
                x = torch.empty(T, B, local._input_features, dtype=local._dtype, device="meta")
        h0: List[Optional[Tensor]] = [None] * local.core.num_layers
        c0 = list(h0)
        if self.carry_state and self._hidden is not None:
            if self._hidden[0] and self._hidden[0][0].shape[0] != B:
                raise ValueError(f"PipelineParallel: the batch changed from {self._hidden[0][0].shape[0]} to {B} "
                                 "while carrying the LSTM state; call reset_state() first")
            h0, c0 = list(self._hidden[0]), list(self._hidden[1])
        order = None if seq is None else seq.sorted_indices  # packed: the engine runs the sorted sequences
        out, h_n, c_n = self.stage(x, sort_states(h0, order), sort_states(c0, order),
                                   target.to(self.devices[-1]) if loss_here else None,
                                   None if seq is None else seq.batch_sizes)
        if seq is not None:
            h_n, c_n = sort_states(h_n, seq.unsorted_indices), sort_states(c_n, seq.unsorted_indices)
            if self.mesh.is_last_stage and not loss_here:
                out = PackedSequence(out, seq.batch_sizes, seq.sorted_indices, seq.unsorted_indices)
        if self.carry_state:
            self._hidden = ([h.detach() for h in h_n], [c.detach() for c in c_n])
        return out

    def train_step(self, input: Tensor, target: Tensor,
                   loss_fn: Optional[Callable[[Tensor, Tensor], Tensor]] = None) -> Tensor:
        """Forward and backward of one step: ``loss_fn(output, target)`` on
        the last stage (or the ``loss_fn`` given at construction, inside the
        pipeline), the pipelined backward everywhere, gradients averaged
        over the replicas. Returns the loss averaged over the replicas, on
        every rank (a 0-dim float64 tensor).

        A ``loss_fn`` that is an ``nn.CrossEntropyLoss`` or ``nn.NLLLoss``
        module is applied per token, to the output ``[T, B, V]`` as
        ``[T·B, V]`` against the target as ``[T·B]`` (torch's own call would
        take B for the classes); any other callable gets the output and
        target as they are."""
        self._check_loss_fn(loss_fn)
        out = self.forward(input, target)
        if self.mesh.is_last_stage:
            loss = out if self._loss is not None else _token_loss(loss_fn, out, target.to(self.devices[-1]))
            loss.backward()
            value = loss.detach()
        else:
            # The placeholder's sum, not out.backward(gradient): torch checks an
            # explicit gradient with torch.fx's symbolic shapes, whose first
            # use imports sympy (35 MiB resident in every such stage's process).
            out.sum().backward()
            value = None
        return self.mesh.share_loss(value)

    @torch.no_grad()
    def eval_step(self, input: Tensor, target: Tensor,
                  loss_fn: Optional[Callable[[Tensor, Tensor], Tensor]] = None) -> Tensor:
        """A forward-only step; returns ``loss_fn(output, target)`` (or the
        built-in loss) averaged over the replicas, on every rank."""
        self._check_loss_fn(loss_fn)
        out = self.forward(input, target)
        value = None
        if self.mesh.is_last_stage:
            value = out if self._loss is not None else _token_loss(loss_fn, out, target.to(self.devices[-1]))
        return self.mesh.share_loss(value)

    def _check_loss_fn(self, loss_fn) -> None:
        if (loss_fn is None) == (self._loss is None):
            raise ValueError("PipelineParallel: give a loss_fn either at construction (computed inside the "
                             "pipeline) or to train_step/eval_step, exactly one of the two")

    # --- state -----------------------------------------------------------------

    def named_stage_parameters(self):
        """(name in the unsplit model, parameter) for this stage's parameters."""
        return zip(self._local.global_names, self._local.weights)

    def state_dict(self, *args, **kwargs) -> Dict[str, Tensor]:  # noqa: D102  (nn.Module's, with global names)
        return {name: p.detach() for name, p in self.named_stage_parameters()}

    def load_state_dict(self, state_dict: Dict[str, Tensor], strict: bool = True, assign: bool = False):
        """Loads this stage's parameters from a stage's or the unsplit
        model's state_dict (the keys of other stages are ignored)."""
        missing = [n for n in self._local.global_names if n not in state_dict]
        if strict and missing:
            raise RuntimeError(f"PipelineParallel.load_state_dict: missing keys for stage {self.mesh.pp_rank}: "
                               f"{missing}")
        with torch.no_grad():
            for name, p in self.named_stage_parameters():
                if name in state_dict:
                    v = state_dict[name]
                    if v.shape != p.shape:
                        raise RuntimeError(f"PipelineParallel.load_state_dict: {name} has shape {tuple(v.shape)}, "
                                           f"expected {tuple(p.shape)}")
                    p.copy_(v)
        return missing

    def consolidated_state_dict(self) -> Optional[Dict[str, Tensor]]:
        """The unsplit model's state_dict, gathered from the stages of the
        first replica (a collective: call it on every rank). Returned on
        global rank 0, ``None`` elsewhere."""
        parts = self.mesh.gather_first_replica(lambda: {k: v.cpu() for k, v in self.state_dict().items()})
        if parts is None:
            return None
        full: Dict[str, Tensor] = {}
        for part in parts:
            full.update(part)
        return full

    def hidden_state(self):
        """The LSTM state carried to the next step: ``(h, c)``, lists of this
        stage's layers' detached states, or None before the first step and
        after :meth:`reset_state`."""
        return self._hidden

    def set_hidden_state(self, hidden) -> None:
        """Set the LSTM state the next step starts from (what
        :meth:`hidden_state` returned, e.g. after loading a checkpoint)."""
        self._hidden = hidden

    # --- timeline --------------------------------------------------------------

    def timeline(self, path: str) -> Optional[Dict[str, object]]:
        """Gathers the last step's schedule from the stages of the first
        replica and writes it on global rank 0 (Chrome trace + PNG, as
        ``Pipeline.timeline``). A collective: call it on every rank. The
        stages' clocks are each machine's steady clock, comparable only
        within one machine."""
        events = [dict(e, stage=self.first_stage + e["stage"]) for e in self.core.trace()]
        names = [f"stage {self.first_stage + s} ({d}, rank {self.mesh.rank})" for s, d in enumerate(self.devices)]
        parts = self.mesh.gather_first_replica(lambda: (events, names))
        if parts is None:
            return None
        all_events, all_names = [], []
        for part_events, part_names in parts:
            all_events += part_events
            all_names += part_names
        return write_timeline(all_events, all_names, path)

    def extra_repr(self) -> str:
        return (f"stage={self.mesh.pp_rank}/{self.mesh.pp}, replica={self.mesh.dp_rank}/{self.mesh.dp}, "
                f"balance={self.balance}, units=[{', '.join(u.name for u in self.core.units)}], "
                f"devices={[str(d) for d in self.devices]}")


def _width_after(units) -> int:
    """The feature width of the activations after ``units`` (the next
    stage's input); dropout keeps the width it gets."""
    width = 0
    for u in units:
        if not u.is_dropout:
            width = u.out_size
    return width


def _token_loss(loss_fn: Callable[[Tensor, Tensor], Tensor], out: Tensor, target: Tensor) -> Tensor:
    """``loss_fn(out, target)``; a class-index loss module over every token
    of a time-major ``[T, B, V]`` output against ``[T, B]`` targets."""
    if isinstance(loss_fn, (nn.CrossEntropyLoss, nn.NLLLoss)) and isinstance(out, Tensor) and out.dim() == 3 \
            and target.dim() == 2:
        return loss_fn(out.reshape(-1, out.size(-1)), target.reshape(-1))
    return loss_fn(out, target)
