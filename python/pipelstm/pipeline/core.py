"""``PipelineCore``: units on stages, the C++ engine that runs them, one run.

``pipelstm.Pipeline``, ``pipelstm.LSTM(devices=...)`` and each process's
stage of ``pipelstm.distributed.PipelineParallel`` hold one core (built
after ``prologue.prepare``): it owns the engine and its links to other
processes, places the units' parameters, runs a pipelined forward as one
autograd node, and reports what ran (``trace``, ``timeline``) and what
was planned (``plan``).
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .. import _C
from ..regularisation import unit_seed
from ..timeline import write_timeline
from .autograd import _PipelineFunction, _unflatten
from .balance import resolve_balance
from .placement import cap_threads, place, thread_budgets
from .plan import Plan
from .prologue import check_checkpoint, check_positive_ints
from .units import Unit

__all__ = ["PipelineCore"]

_engine = _C.pipeline


class PipelineCore:
    """Units split into stages on devices, and the engine that runs them.

    Args:
        units: from ``units.flatten`` (or a contiguous run of them), with
            their ``cost`` estimated (``balance.estimate_costs``).
        devices: one per stage, checked (``placement.stage_devices``).
        balance: ``"auto"`` (by the units' costs) or the units per stage.
        threads: intra-op threads per CPU stage (``placement.thread_budgets``).
        chunks: K, the time chunks (clamped to the sequence length).
        micro_batches: M, the micro-batches (clamped to the batch).
        checkpoint: activation recomputation, one of ``prologue.CHECKPOINT_MODES``.
        loss: ``units.loss_spec`` of the loss the last stage computes, or None.
        sample_shape: ``(T, B)`` of the sample the costs were profiled on
            (seconds, activations for that sample), or None for the FLOP
            cost model (per token).
        who: what error messages name, e.g. ``"Pipeline"``.

    The units' parameters are moved to their stage's device here, in place.
    The settings (``chunks``, ``micro_batches``, ``checkpoint``,
    ``threads``) are plain attributes: a change applies from the next run
    (``threads``: from the next engine, built on unpickling).

    A core pickles and deep-copies without its engine, which cannot be
    either: a new one is built from the same settings (each CPU stage's
    threads capped to this machine's CPUs), and a deep copy's units point
    at the copied modules when the modules are copied in the same memo.

    Raises:
        ValueError, TypeError: a setting out of range (the messages start
            with ``who``).
    """

    def __init__(
        self,
        units: Sequence[Unit],
        devices: Sequence[torch.device],
        balance: Union[str, Sequence[int]] = "auto",
        threads: Union[None, int, Sequence[int]] = None,
        *,
        chunks: int = 1,
        micro_batches: int = 1,
        checkpoint: str = "never",
        loss: Optional[dict] = None,
        sample_shape: Optional[Tuple[int, int]] = None,
        who: str = "Pipeline",
    ) -> None:
        check_positive_ints(who, chunks=chunks, micro_batches=micro_batches)
        self.checkpoint = check_checkpoint(who, checkpoint)
        self.units = list(units)
        self.devices = list(devices)
        self.balance = resolve_balance(balance, self.units, len(self.devices), who)
        self.threads = thread_budgets(threads, self.devices, who)
        self.chunks, self.micro_batches = chunks, micro_batches
        self.loss = loss
        self.sample_shape = sample_shape
        self.saved_activation_bytes = 0
        self.who = who
        self._links: Optional[tuple] = None
        place(self.units, self.balance, self.devices)
        self._build_engine()

    # --- the engine ----------------------------------------------------------------

    @property
    def engine(self) -> "_engine.Engine":
        """The C++ engine (``pipelstm._C.pipeline.Engine``)."""
        return self._engine

    def stage_specs(self) -> List["_engine.StageSpec"]:
        """The engine's description of the stages. LSTM layers are numbered
        in order from 0 (their slot among the initial and final states); the
        loss, if any, ends the last stage."""
        specs, i, layer = [], 0, 0
        for s, count in enumerate(self.balance):
            stage_units = []
            for u in self.units[i : i + count]:
                stage_units.append(u.spec(layer))
                layer += u.has_state
            if self.loss is not None and s == len(self.balance) - 1:
                stage_units.append(_engine.UnitSpec(_engine.UnitKind.cross_entropy, "loss", **self.loss))
            specs.append(_engine.StageSpec(str(self.devices[s]), stage_units, int(self.threads[s])))
            i += count
        return specs

    def connect(self, prev: Optional["_engine.RemoteSpec"], next: Optional["_engine.RemoteSpec"], timeout: float,
                first_stage: int, first_unit: int, name: str) -> None:
        """Links the first stage to the process before (``prev``) and the last
        to the process after (``next``), as ``Engine.connect``: activations
        and gradients then cross process boundaries point-to-point.
        ``first_stage`` and ``first_unit`` are the global indices of this
        core's first stage and unit (its units' masks are seeded by their
        index in the whole model). A connected core can be neither pickled
        nor copied."""
        self._links = (prev, next, timeout, first_stage, first_unit, name)
        self._engine.connect(*self._links)

    def _build_engine(self) -> None:
        self._engine = _engine.Engine(self.stage_specs())
        if self._links is not None:
            self._engine.connect(*self._links)

    def __getstate__(self) -> dict:
        if self._links is not None:
            raise TypeError("PipelineCore: a core connected to other processes (PipelineParallel) cannot be "
                            "pickled or copied")
        state = self.__dict__.copy()
        del state["_engine"]
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("who", "Pipeline")  # pickled before the core kept it
        self.__dict__.update(state)
        self.threads = cap_threads(self.threads, self.devices)
        self._build_engine()

    # --- what a run takes, checked before any work ----------------------------------

    def check_input(self, x: Tensor, batch_first: bool = False, on_device: bool = False) -> None:
        """Checks the time-major input of a run against the first unit that
        reads it: ``[T, B]`` integer indices for an Embedding, else
        ``[T, B, I]`` features of the unit's width and dtype. Pointwise units
        (dropout, activations) before it pass their input through.

        Args:
            x: the input, time-major (``[T, B, ...]``).
            batch_first: the caller got it as ``[B, T, ...]`` (the messages say so).
            on_device: it must already be on the first stage's device (else
                the engine copies it there; it must hold data, not be meta).

        Raises:
            ValueError: ``x`` is not a tensor, has the wrong number of
                dimensions or the wrong dtype.
            RuntimeError: the wrong feature size, or the wrong device.
        """
        layout = "[B, T" if batch_first else "[T, B"
        unit = next((u for u in self.units if not u.is_dropout and u.kind != "activation"), None)
        indices = unit is not None and unit.kind == "embedding"
        dims, shape = (2, f"{layout}] indices") if indices else (3, f"{layout}, I] features")
        if not isinstance(x, Tensor) or x.dim() != dims and (indices or unit is not None or x.dim() < 2):
            got = f"a {x.dim()}-D tensor of shape {_shape(x, batch_first)}" if isinstance(x, Tensor) \
                else type(x).__name__
            raise ValueError(f"{self.who}: expected input of shape {shape}, got {got}")
        if indices:
            if x.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"{self.who}: the first unit, {unit.name!r}, is an Embedding: expected input of "
                                 f"integer indices (torch.int64 or torch.int32), got {x.dtype}")
        elif unit is not None:
            dtype = next((p.dtype for p in unit.params() if p is not None), x.dtype)
            if x.size(-1) != unit.input_size:
                raise RuntimeError(f"{self.who}: expected input of shape {shape} with I={unit.input_size} (the "
                                   f"input size of the first unit, {unit.name!r}), got {_shape(x, batch_first)}")
            if x.dtype != dtype:
                raise ValueError(f"{self.who}: expected input of dtype {dtype} (that of the first unit, "
                                 f"{unit.name!r}), got {x.dtype}; convert it: input.to({dtype})")
        first = self.devices[0]
        if on_device and x.device != first or x.device.type == "meta":
            raise RuntimeError(f"{self.who}: the input is on {x.device}, but the first pipeline stage runs on "
                               f"{first}: move the input to {first}")

    def check_states(self, h0: Sequence[Optional[Tensor]], c0: Sequence[Optional[Tensor]], batch: int) -> None:
        """Checks the initial states of a run (as ``run`` takes them, per LSTM
        layer, None for zeros): ``h0[l]`` ``[B, P]`` and ``c0[l]`` ``[B, H]`` in
        the layer's dtype, on any device (the engine moves them).

        Raises:
            RuntimeError: a state of the wrong type, shape or dtype.
        """
        lstms = [u for u in self.units if u.has_state]
        for states, name, width in ((h0, "h_0", "out_size"), (c0, "c_0", "hidden_size")):
            for l, (u, t) in enumerate(zip(lstms, states)):
                if t is None:
                    continue
                expected = [batch, getattr(u, width)]
                if not isinstance(t, Tensor) or list(t.shape) != expected:
                    got = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
                    raise RuntimeError(f"{self.who}: expected {name}[{l}] of shape {expected} (batch {batch}, "
                                       f"LSTM layer {u.name!r}), got {got}")
                dtype = u.params()[0].dtype
                if t.dtype != dtype:
                    raise RuntimeError(f"{self.who}: expected {name}[{l}] of dtype {dtype} (that of LSTM layer "
                                       f"{u.name!r}), got {t.dtype}")

    def check_target(self, target: Optional[Tensor], T: int, B: int, batch_first: bool = False) -> None:
        """Checks a run's target (time-major ``[T, B]``): given exactly when the
        core computes a loss, int64 class indices of the input's shape.

        Raises:
            ValueError: a target without a loss or none with one, or not a
                2-D int64 tensor.
            RuntimeError: a shape other than the input's.
        """
        if (target is None) != (self.loss is None):
            raise ValueError(f"{self.who}: pass target= exactly when the pipeline was built with a loss_fn")
        if target is None:
            return
        layout = "[B, T] with batch_first" if batch_first else "[T, B]"
        if not isinstance(target, Tensor) or target.dim() != 2 or target.dtype != torch.int64:
            got = type(target).__name__ if not isinstance(target, Tensor) else \
                f"{target.dtype} {_shape(target, batch_first) if target.dim() == 2 else list(target.shape)}"
            raise ValueError(f"{self.who}: expected target of dtype torch.int64 and shape {layout}, got {got}")
        if tuple(target.shape) != (T, B):
            expected = [B, T] if batch_first else [T, B]
            raise RuntimeError(f"{self.who}: expected target of shape {expected} (the input's), got "
                               f"{_shape(target, batch_first)}")

    # --- running -------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        """The LSTM layers among the units: the initial and final states ``run`` takes and gives."""
        return sum(u.has_state for u in self.units)

    def run(self, x: Tensor, h0: Sequence[Optional[Tensor]], c0: Sequence[Optional[Tensor]], training: bool,
            target: Optional[Tensor] = None, batch_sizes: Optional[Tensor] = None) -> Tuple[Tensor, list, list]:
        """One pipelined forward, differentiable when anything requires grad:
        its backward is the engine's pipelined backward.

        Args:
            x: the time-major input ``[T, B, ...]`` on the first stage's
                device (or, with a link to a previous process, only its shape).
            h0, c0: per LSTM layer (``num_layers``), its initial state or None
                (zeros); the engine moves each to its layer's device.
            training: dropout on (and the units in training mode).
            target: ``[T, B]`` class indices for the loss of the last stage
                (a core built with ``loss``), else None.
            batch_sizes: packed input (``packed.py``): ``x``, ``target`` and the output are then
                ``[N, ...]`` packed rows, the states those of the sorted sequences.

        Returns:
            The output (with a ``target``: the loss) and the final states per
            LSTM layer, each on its stage's device. ``saved_activation_bytes``
            tells what a forward with grad kept.
        """
        L = len(h0)
        # One seed a pass for every mask the pass draws, the engine's units'
        # and the weights' alike, each unit's from its place in the whole
        # model: ranks seeded alike draw the masks one process would.
        pass_seed = _engine.draw_pass_seed() if training else None
        first_unit = self._links[4] if self._links is not None else 0
        params = [u.params_for_call(training, unit_seed(pass_seed, first_unit + i))
                  for i, u in enumerate(self.units)] + ([[]] if target is not None else [])
        unit_counts = [tuple(p is not None for p in ps) for ps in params]
        flat = [p for ps in params for p in ps if p is not None]
        needs_grad = torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in flat)
            or any(t is not None and t.requires_grad for t in list(h0) + list(c0))
        )
        if needs_grad:
            outs = _PipelineFunction.apply(self, (L, unit_counts, batch_sizes, pass_seed), training, target, x, *h0,
                                           *c0, *flat)
            return outs[0], list(outs[1 : 1 + L]), list(outs[1 + L :])
        run = self._engine.forward(x, list(h0), list(c0), _unflatten(flat, unit_counts), self.chunks,
                                   self.micro_batches, training, False, _engine.Checkpoint.never, target, batch_sizes,
                                   pass_seed)
        output, h_n, c_n = run.take_outputs()
        return output, list(h_n), list(c_n)

    # --- what ran, what was planned ---------------------------------------------------

    def trace(self) -> List[dict]:
        """What ran in the last forward (and backward): one dict per span, with
        ``stage``, ``phase``, ``micro_batch``, ``chunk``, ``start_ns``, ``end_ns``."""
        return [dict(stage=e.stage, phase=e.phase, micro_batch=e.micro_batch, chunk=e.chunk,
                     start_ns=e.start_ns, end_ns=e.end_ns) for e in self._engine.trace()]

    def timeline(self, path: str, names: Optional[Sequence[str]] = None) -> Dict[str, object]:
        """Writes the schedule that last ran as a Chrome trace (``path``, JSON;
        open it in chrome://tracing or ui.perfetto.dev) and, if matplotlib is
        installed, a Gantt chart next to it (same name, ``.png``).

        Args:
            path: where to write the trace.
            names: one row name per stage; default ``"stage s (device)"``.

        Returns:
            The paths written and the measured bubble (idle fraction of the
            stages over each pass) with the theoretical (S-1)/(K*M+S-1).
        """
        if names is None:
            names = [f"stage {s} ({d})" for s, d in enumerate(self.devices)]
        return write_timeline(self.trace(), list(names), path)

    @property
    def plan(self) -> Plan:
        """The stages: device, threads, units, estimated cost, parameters, activation memory."""
        return Plan(self.units, self.balance, self.devices, self.threads, self.checkpoint, self.sample_shape)

    def extra_repr(self) -> str:
        """The settings, as the holding module's repr shows them."""
        return (f"devices={[str(d) for d in self.devices]}, balance={self.balance}, chunks={self.chunks}, "
                f"micro_batches={self.micro_batches}"
                + (f", checkpoint={self.checkpoint!r}" if self.checkpoint != "never" else ""))


def _shape(x: Tensor, batch_first: bool) -> List[int]:
    """The shape of time-major ``x`` as the caller wrote it."""
    shape = list(x.shape)
    if batch_first and len(shape) >= 2:
        shape[0], shape[1] = shape[1], shape[0]
    return shape

