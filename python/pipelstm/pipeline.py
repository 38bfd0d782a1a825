"""``pipelstm.Pipeline``: a sequential LSTM model split into stages on devices.

The model is a ``torch.nn.Sequential`` of ``Embedding``, ``pipelstm.LSTM`` or
``nn.LSTM``, ``Dropout``, ``Linear`` (and ``Identity``). It is flattened into
*units* (every layer of a multi-layer LSTM is a unit of its own, and so is
the dropout between two of its layers), and the units are split into
contiguous *stages*, one device each. The C++ engine (``csrc/pipeline``) runs
the stages in one worker thread each, outside the GIL, as a wavefront over
``chunks`` time chunks x ``micro_batches`` micro-batches; ``loss.backward()``
runs the reverse wavefront. See docs/pipeline.md.

All units run natively in C++ (LSTM layers on the fused layer ops,
``Embedding`` as ``at::embedding``, ``Linear`` as ``at::linear``, ``Dropout``
as a Bernoulli mask), so the workers never take the GIL.
"""

import math
import os
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _C, ops
from .geometry import LayerGeometry
from .timeline import write_timeline

__all__ = ["Pipeline", "partition"]

_engine = _C.pipeline
_State = Tuple[Tensor, Tensor]
CHECKPOINT_MODES = ("never", "except_last", "always")


def check_checkpoint(who: str, checkpoint: str) -> str:
    if checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"{who}: checkpoint must be one of {', '.join(map(repr, CHECKPOINT_MODES))}, "
                         f"got {checkpoint!r}")
    return checkpoint


@dataclass
class _Unit:
    kind: str  # "lstm", "embedding", "linear", "dropout"
    name: str
    module: nn.Module
    param_names: List[Optional[str]]
    layer: int = -1  # LSTM: index among all LSTM layers of the model
    input_size: int = 0
    hidden_size: int = 0
    proj_size: int = 0
    p: float = 0.0
    activation: str = ""  # activation: the engine's name, e.g. "gelu_tanh"
    eps: float = 1e-5  # layer_norm
    out_size: int = 0
    cost: float = 0.0  # estimated seconds (profiled) or FLOPs per token (cost model)
    act_bytes: float = 0.0  # saved for backward, per token (or in all, with a sample)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def params(self) -> List[Optional[Tensor]]:
        return [None if n is None else getattr(self.module, n) for n in self.param_names]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.params() if p is not None)


# The activations the engine runs natively: module type -> its name there.
_ACTIVATIONS = {
    nn.ReLU: lambda m: "relu",
    nn.Tanh: lambda m: "tanh",
    nn.Sigmoid: lambda m: "sigmoid",
    nn.GELU: lambda m: "gelu" if m.approximate == "none" else "gelu_tanh",
    nn.SiLU: lambda m: "silu",
}
_SUPPORTED = ("Embedding, LSTM (pipelstm.LSTM or nn.LSTM), Dropout, Linear, LayerNorm (over the last dimension), "
              "ReLU, Tanh, Sigmoid, GELU, SiLU and Identity")


def _flatten(children: Iterable[Tuple[str, nn.Module]]) -> List[_Unit]:
    """The units of a Sequential's ``named_children()``. A module named ``""``
    gives its units without a prefix: one LSTM on its own
    (``pipelstm.LSTM(devices=...)``) flattens into ``l0, dropout0, l1, ...``."""
    units: List[_Unit] = []
    layer = 0
    for name, child in children:
        prefix = f"{name}." if name else ""
        if isinstance(child, nn.Identity):
            continue
        if isinstance(child, nn.RNNBase):
            if child.mode != "LSTM":
                raise ValueError(f"Pipeline: module {name!r} is a {child.mode}; only LSTMs are supported")
            if child.bidirectional:
                raise ValueError(
                    f"Pipeline: module {name!r} is a bidirectional LSTM, which cannot be pipelined over time "
                    "chunks (its reverse direction needs the end of the sequence before the start); "
                    "use unidirectional LSTMs"
                )
            H, P = child.hidden_size, child.proj_size
            for l in range(child.num_layers):
                sfx = f"_l{l}"
                names = [f"weight_ih{sfx}", f"weight_hh{sfx}"]
                names += [f"bias_ih{sfx}", f"bias_hh{sfx}"] if child.bias else [None, None]
                names += [f"weight_hr{sfx}"] if P > 0 else [None]
                units.append(_Unit(
                    "lstm", f"{prefix}l{l}", child, names, layer=layer,
                    input_size=child.input_size if l == 0 else (P or H), hidden_size=H, proj_size=P,
                    out_size=P or H,
                ))
                layer += 1
                if child.dropout > 0 and l < child.num_layers - 1:
                    units.append(_Unit("dropout", f"{prefix}dropout{l}", child, [], p=child.dropout, out_size=P or H))
        elif isinstance(child, nn.Embedding):
            if child.max_norm is not None or child.sparse:
                raise ValueError(f"Pipeline: Embedding {name!r}: max_norm and sparse are not supported")
            units.append(_Unit("embedding", name, child, ["weight"], out_size=child.embedding_dim))
        elif isinstance(child, nn.Linear):
            units.append(_Unit(
                "linear", name, child, ["weight", "bias" if child.bias is not None else None],
                input_size=child.in_features, out_size=child.out_features,
            ))
        elif isinstance(child, nn.Dropout):
            units.append(_Unit("dropout", name, child, [], p=child.p))
        elif type(child) in _ACTIVATIONS:
            width = units[-1].out_size if units else 0
            units.append(_Unit("activation", name, child, [], activation=_ACTIVATIONS[type(child)](child),
                               input_size=width, out_size=width))
        elif isinstance(child, nn.LayerNorm):
            if len(child.normalized_shape) != 1:
                raise ValueError(f"Pipeline: LayerNorm {name!r} must normalise over the last dimension only, "
                                 f"got normalized_shape={tuple(child.normalized_shape)}")
            width = child.normalized_shape[0]
            names = ["weight" if child.weight is not None else None,
                     "bias" if getattr(child, "bias", None) is not None else None]
            units.append(_Unit("layer_norm", name, child, names, eps=child.eps, input_size=width, out_size=width))
        else:
            raise ValueError(
                f"Pipeline: module {name!r} ({type(child).__name__}) is not supported; a pipeline is a "
                f"Sequential of {_SUPPORTED}"
            )
    if not units:
        raise ValueError("Pipeline: the model has no units")
    return units


def resolve_balance(balance: Union[str, Sequence[int]], units: Sequence[_Unit], stages: int, who: str) -> List[int]:
    """Units per stage: ``"auto"`` splits by the units' costs; a given list is checked."""
    n = len(units)
    if isinstance(balance, str):
        if balance != "auto":
            raise ValueError(f"{who}: balance must be 'auto' or a list of unit counts, got {balance!r}")
        return partition([u.cost for u in units], stages)
    balance = list(balance)
    if len(balance) != stages or any(not isinstance(b, int) or b < 1 for b in balance):
        raise ValueError(f"{who}: balance {balance} must give a positive unit count for each of the {stages} stages")
    if sum(balance) != n:
        raise ValueError(f"{who}: balance {balance} sums to {sum(balance)}, but the model has {n} units "
                         f"({', '.join(u.name for u in units)})")
    return balance


def check_positive_ints(who: str, **values) -> None:
    for what, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{who}: {what} must be a positive int, got {v!r}")


def _thread_budgets(threads: Union[None, int, Sequence[int]], devices: Sequence[torch.device],
                    who: str = "Pipeline") -> List[int]:
    """Intra-op threads per stage (0 for accelerators): given, or the
    caller's ``torch.get_num_threads()`` shared among the CPU stages. A CPU
    stage gets 1 to ``os.cpu_count()`` threads."""
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
    return threads


def _place(units: Sequence[_Unit], balance: Sequence[int], devices: Sequence[torch.device]) -> None:
    """Moves each unit's parameters to its stage's device, in place (the same
    Parameter objects: an optimizer made before or after steps them there)."""
    stage_of = [s for s, b in enumerate(balance) for _ in range(b)]
    with torch.no_grad():
        for u, s in zip(units, stage_of):
            u.device = devices[s]
            for name in u.param_names:
                if name is not None:
                    p = getattr(u.module, name)
                    if p.device != u.device:
                        p.data = p.data.to(u.device)


def _stage_specs(units: Sequence[_Unit], balance: Sequence[int], devices: Sequence[torch.device],
                 threads: Sequence[int], loss: Optional[dict] = None) -> list:
    """The engine's description of the stages. LSTM layers are numbered in
    order from 0 (their slot among the initial and final states). A ``loss``
    (``ignore_index``, ``mean``) ends the last stage."""
    specs, i, layer = [], 0, 0
    for s, count in enumerate(balance):
        stage_units = []
        for u in units[i : i + count]:
            kind = getattr(_engine.UnitKind, u.kind)
            kw = {}
            if u.kind == "embedding":
                pad = u.module.padding_idx
                kw = dict(padding_idx=-1 if pad is None else pad, scale_grad_by_freq=u.module.scale_grad_by_freq)
            elif u.kind == "dropout":
                kw = dict(p=float(u.p))
            elif u.kind == "activation":
                kw = dict(activation=getattr(_engine.Activation, u.activation))
            elif u.kind == "layer_norm":
                kw = dict(eps=float(u.eps))
            elif u.kind == "lstm":
                kw = dict(state_index=layer)
                layer += 1
            stage_units.append(_engine.UnitSpec(kind, u.name, **kw))
        if loss is not None and s == len(balance) - 1:
            stage_units.append(_engine.UnitSpec(_engine.UnitKind.cross_entropy, "loss", **loss))
        specs.append(_engine.StageSpec(str(devices[s]), stage_units, int(threads[s])))
        i += count
    return specs


def _loss_spec(loss_fn: Optional[nn.Module]) -> Optional[dict]:
    """The engine's loss unit for ``loss_fn`` (``nn.CrossEntropyLoss``)."""
    if loss_fn is None:
        return None
    if type(loss_fn) is not nn.CrossEntropyLoss:
        raise ValueError(f"Pipeline: loss_fn must be an nn.CrossEntropyLoss, got {type(loss_fn).__name__}")
    if loss_fn.weight is not None or loss_fn.label_smoothing != 0.0 or loss_fn.reduction not in ("mean", "sum"):
        raise ValueError("Pipeline: loss_fn supports ignore_index and reduction='mean' or 'sum'; not class weights, "
                         f"label_smoothing or reduction={loss_fn.reduction!r}")
    return dict(ignore_index=int(loss_fn.ignore_index), mean=loss_fn.reduction == "mean")


def stage_devices(who: str, devices) -> List[torch.device]:
    """The stages' devices, checked: a non-empty list of available devices."""
    if isinstance(devices, (str, torch.device)) or len(devices) == 0:
        raise ValueError(f"{who}: devices must be a non-empty list of devices, got {devices!r}")
    return [_check_device(d) for d in devices]


def check_stage_count(who: str, stages: int, units: Sequence[_Unit]) -> None:
    if stages > len(units):
        raise ValueError(f"{who}: {stages} stages but only {len(units)} units ({', '.join(u.name for u in units)}); "
                         "use at most as many devices as units")


def _check_device(d) -> torch.device:
    try:
        dev = torch.device(d)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"Pipeline: unknown device {d!r} ({e})") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"Pipeline: device {d!r} is not available (no CUDA device on this machine)")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(f"Pipeline: unknown device {d!r} ({torch.cuda.device_count()} CUDA devices)")
        return torch.device("cuda", index)
    raise ValueError(f"Pipeline: unsupported device {d!r}; use 'cpu' or 'cuda:N'")


def partition(costs: Sequence[float], stages: int) -> List[int]:
    """Splits ``costs`` into ``stages`` contiguous non-empty runs minimising the
    largest run's sum (the slowest stage); returns the run lengths.

    Dynamic programming over (stage, units so far), O(stages * n^2); among
    equally good splits the one with the earliest, smallest stages first.
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} units into {stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    INF = float("inf")
    # best[s][i]: the smallest possible slowest stage splitting units[:i] into s stages
    best = [[INF] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                v = max(best[s - 1][j], prefix[i] - prefix[j])
                if v < best[s][i] - 1e-15 * max(1.0, abs(v)):
                    best[s][i], cut[s][i] = v, j
    sizes, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


class _PipelineFunction(torch.autograd.Function):
    """The whole pipelined forward as one autograd node; its backward is the
    engine's pipelined backward, returning the gradients of the input, the
    initial states and every parameter (each on its own stage's device)."""

    @staticmethod
    def forward(ctx, pipe: "Pipeline", layout, target: Optional[Tensor], input: Tensor, *tensors: Optional[Tensor]):
        L, unit_counts = layout
        h0, c0 = list(tensors[:L]), list(tensors[L : 2 * L])
        params = _unflatten(tensors[2 * L :], unit_counts)
        run = pipe._engine.forward(
            input, h0, c0, params, pipe.chunks, pipe.micro_batches, pipe.training, True,
            getattr(_engine.Checkpoint, getattr(pipe, "checkpoint", "never")), target,
        )
        pipe.saved_activation_bytes = run.saved_bytes
        ctx.run, ctx.layout = run, layout
        ctx.input_device, ctx.input_float = input.device, input.is_floating_point()
        ctx.state_devices = [None if t is None else t.device for t in tensors[: 2 * L]]
        ctx.param_devices = [None if t is None else t.device for t in tensors[2 * L :]]
        ctx.set_materialize_grads(False)
        return (run.output, *run.h_n, *run.c_n)

    @staticmethod
    def backward(ctx, grad_output, *grad_states):
        L, unit_counts = ctx.layout
        run = ctx.run  # frees its saved activations as it goes; a second backward raises
        grad_input, gh0, gc0, gparams = run.backward(
            grad_output, list(grad_states[:L]), list(grad_states[L:])
        )
        if grad_input is not None:
            grad_input = grad_input.to(ctx.input_device) if ctx.input_float else None
        states = [
            None if g is None or d is None else g.to(d) for g, d in zip(list(gh0) + list(gc0), ctx.state_devices)
        ]
        # gparams has an entry per parameter slot; keep those the forward got.
        flat = []
        for unit_grads, count in zip(gparams, unit_counts):
            flat.extend(g for g, present in zip(unit_grads, count) if present)
        return (None, None, None, grad_input, *states, *flat)


def run_engine(owner, units: Sequence[_Unit], x: Tensor, h0: List[Optional[Tensor]],
               c0: List[Optional[Tensor]], target: Optional[Tensor] = None) -> Tuple[Tensor, List[Tensor], List[Tensor]]:
    """One pipelined forward of ``owner._engine`` (with ``owner.chunks``,
    ``.micro_batches``, ``.training``, ``.checkpoint``) over ``units``; differentiable through
    ``_PipelineFunction`` when anything requires grad. Returns the output
    (with a ``target``, the loss of the engine's loss unit) and the final
    states per LSTM layer."""
    L = len(h0)
    params = [u.params() for u in units] + ([[]] if target is not None else [])
    unit_counts = [tuple(p is not None for p in ps) for ps in params]
    flat = [p for ps in params for p in ps if p is not None]
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in flat)
        or any(t is not None and t.requires_grad for t in h0 + c0)
    )
    if needs_grad:
        outs = _PipelineFunction.apply(owner, (L, unit_counts), target, x, *h0, *c0, *flat)
        return outs[0], list(outs[1 : 1 + L]), list(outs[1 + L :])
    run = owner._engine.forward(
        x, h0, c0, _unflatten(flat, unit_counts), owner.chunks, owner.micro_batches, owner.training, False,
        _engine.Checkpoint.never, target,
    )
    return run.output, list(run.h_n), list(run.c_n)


def _unflatten(flat: Sequence[Tensor], unit_counts) -> List[List[Optional[Tensor]]]:
    """Per unit, its parameter slots (None where absent) from the flat list."""
    out, i = [], 0
    for present in unit_counts:
        params = []
        for p in present:
            params.append(flat[i] if p else None)
            i += p
        out.append(params)
    return out


class EngineHolder:
    """For modules holding a C++ engine (``_engine``), which can be neither
    copied nor pickled: it is left out of the state and ``_build_engine()``
    makes a new one from the same stage specs. ``copy.deepcopy`` goes
    through these too (one memo for the whole state, so the copied units
    point at the copied modules)."""

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_engine", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        devices = getattr(self, "_devices", None)
        if devices is not None:
            # A checkpoint saved on a machine with more CPUs loads here with
            # this machine's count at most.
            cpus = os.cpu_count() or 1
            self.threads = [min(max(int(n), 1), cpus) if d.type == "cpu" else int(n)
                            for n, d in zip(self.threads, devices)]
        self._build_engine()


class Pipeline(EngineHolder, nn.Module):
    """A ``Sequential`` LSTM model pipelined over devices, time chunks and micro-batches.

    Args:
        module: ``nn.Sequential`` of ``Embedding``, ``pipelstm.LSTM``/``nn.LSTM``
            (unidirectional), ``Dropout``, ``Linear`` and ``Identity``. Its
            submodules become this module's (same names, so ``state_dict()`` is
            the unsplit model's), their parameters moved to their stage's device.
        devices: one device per stage, e.g. ``["cpu", "cpu"]`` or ``["cuda:0", "cuda:1"]``.
        chunks: K, the number of time chunks (clamped to the sequence length).
        micro_batches: M, the number of micro-batches (clamped to the batch).
        balance: ``"auto"``, or the number of units per stage, e.g. ``[2, 3]``.
        sample: an input to profile the units on for ``balance="auto"``;
            without one, a FLOP cost model balances.
        threads: intra-op threads per CPU stage (an int or one per stage);
            default: ``torch.get_num_threads()`` shared among the CPU stages.
        checkpoint: activation recomputation, trading compute for memory:
            ``"never"`` keeps every activation backward needs; ``"always"``
            keeps of each (micro-batch, chunk) only the stage's input, the
            LSTM layers' initial states and the dropout masks, and runs its
            forward again just before its backward; ``"except_last"`` does so
            for all but each stage's last item (whose backward comes first).
            Results are bitwise the same; ``saved_activation_bytes`` tells
            what the last forward kept.
        loss_fn: an ``nn.CrossEntropyLoss`` (``ignore_index``, reduction
            ``"mean"`` or ``"sum"``) computed inside the last stage, item by
            item, while the other stages work: ``forward(input, hx,
            target=...)`` then returns the loss (a scalar) instead of the
            logits, and its backward starts from there.

    ``forward(input, hx=None)`` takes ``[T, B]`` indices (first unit an
    Embedding) or ``[T, B, I]`` features (``[B, T, ...]`` when the LSTMs are
    ``batch_first``) and optional ``(h_0, c_0)`` of shape ``[L, B, P]`` and
    ``[L, B, H]`` over all L LSTM layers; it returns ``output, (h_n, c_n)``.
    With ``loss_fn``, ``forward(input, hx=None, target=...)`` takes the
    targets ``[T, B]`` (``[B, T]`` with ``batch_first``) and returns
    ``loss, (h_n, c_n)``.
    """

    def __init__(
        self,
        module: nn.Sequential,
        devices: Sequence[Union[str, torch.device]],
        chunks: int = 1,
        micro_batches: int = 1,
        balance: Union[str, Sequence[int]] = "auto",
        sample: Optional[Tensor] = None,
        threads: Union[None, int, Sequence[int]] = None,
        checkpoint: str = "never",
        loss_fn: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Sequential):
            raise ValueError(f"Pipeline: expected an nn.Sequential, got {type(module).__name__}")
        check_positive_ints("Pipeline", chunks=chunks, micro_batches=micro_batches)
        self.checkpoint = check_checkpoint("Pipeline", checkpoint)
        self.saved_activation_bytes = 0
        self._loss = _loss_spec(loss_fn)
        self._devices = stage_devices("Pipeline", devices)
        units = _flatten(module.named_children())
        S = len(self._devices)
        check_stage_count("Pipeline", S, units)
        lstms = {id(u.module): u.module for u in units if u.kind == "lstm"}.values()
        batch_first = {m.batch_first for m in lstms}
        if len(batch_first) > 1:
            raise ValueError("Pipeline: all LSTMs must agree on batch_first")
        self._batch_first = batch_first.pop() if batch_first else False
        self.chunks, self.micro_batches = chunks, micro_batches
        self._units = units
        self._sample_shape = None
        self._estimate_costs(sample)
        self.balance = resolve_balance(balance, units, S, "Pipeline")
        self.threads = _thread_budgets(threads, self._devices)
        _place(units, self.balance, self._devices)
        for name, child in module.named_children():
            self.add_module(name, child)
        self.training = module.training
        self._build_engine()
        self._num_layers = sum(u.kind == "lstm" for u in units)

    def __getitem__(self, index: int) -> nn.Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def _build_engine(self) -> None:
        self._engine = _engine.Engine(_stage_specs(self._units, self.balance, self._devices, self.threads,
                                                   self._loss))

    # --- running -----------------------------------------------------------------

    def forward(self, input: Tensor, hx=None, target: Optional[Tensor] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        if not isinstance(input, Tensor) or input.dim() < 2:
            raise ValueError("Pipeline: expected input of shape [T, B] (indices) or [T, B, I] "
                             "([B, T, ...] with batch_first)")
        x = input.transpose(0, 1) if self._batch_first else input
        if (target is None) != (self._loss is None):
            raise ValueError("Pipeline: pass target= exactly when the pipeline was built with a loss_fn")
        if target is not None:
            if not isinstance(target, Tensor) or target.dim() != 2 or target.dtype != torch.int64:
                raise ValueError("Pipeline: expected target of dtype torch.int64 and shape [T, B] ([B, T] with "
                                 f"batch_first), got {getattr(target, 'dtype', type(target).__name__)} "
                                 f"{tuple(getattr(target, 'shape', ()))}")
            if self._batch_first:
                target = target.t()
        L = self._num_layers
        h0: List[Optional[Tensor]] = [None] * L
        c0: List[Optional[Tensor]] = [None] * L
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise ValueError("Pipeline: hx must be a tuple (h_0, c_0)")
            for states, given in ((h0, hx[0]), (c0, hx[1])):
                if len(given) != L:
                    raise ValueError(f"Pipeline: expected initial states for {L} LSTM layers, got {len(given)}")
                for l in range(L):
                    states[l] = given[l]
        out, h_n, c_n = run_engine(self, self._units, x, h0, c0, target)
        if self._batch_first and target is None:
            out = out.transpose(0, 1)
        return out, (self._stack(h_n, out.device), self._stack(c_n, out.device))

    @staticmethod
    def _stack(states: List[Tensor], device: torch.device):
        if not states:
            return None
        if len({tuple(s.shape) for s in states}) > 1:
            return [s.to(device) for s in states]  # layers of different widths
        return torch.stack([s.to(device) for s in states])

    def _engine_units(self) -> List[_engine.UnitSpec]:
        """The units as the engine runs them (the loss last, if any)."""
        specs = _stage_specs(self._units, self.balance, self._devices, self.threads, self._loss)
        return [u for st in specs for u in st.units]

    # --- plan and balance ----------------------------------------------------------

    def _estimate_costs(self, sample: Optional[Tensor]) -> None:
        if sample is None:
            self._cost_unit = "MFLOP/token"
            for u in self._units:
                u.cost, u.act_bytes = _flop_model(u)
            return
        self._cost_unit = "ms"
        x = sample.transpose(0, 1) if self._batch_first else sample
        T, B = x.shape[0], x.shape[1]
        self._sample_shape = (T, B)
        for u in self._units:
            x, u.cost, u.act_bytes = _profile(u, x)

    @property
    def plan(self) -> "Plan":
        """The stages: device, units, estimated time, parameters, activation memory."""
        return Plan(self)

    # --- timeline ------------------------------------------------------------------

    def trace(self) -> List[dict]:
        """What ran in the last forward (and backward): one dict per span."""
        return [
            dict(stage=e.stage, phase=e.phase, micro_batch=e.micro_batch, chunk=e.chunk,
                 start_ns=e.start_ns, end_ns=e.end_ns)
            for e in self._engine.trace()
        ]

    def timeline(self, path: str) -> Dict[str, object]:
        """Writes the schedule that last ran as a Chrome trace (``path``, JSON;
        open it in chrome://tracing or ui.perfetto.dev) and, if matplotlib is
        installed, a Gantt chart next to it (same name, ``.png``).

        Returns the paths written and the measured bubble (idle fraction of
        the stages over each pass) with the theoretical (S-1)/(K*M+S-1).
        """
        names = [f"stage {s} ({d})" for s, d in enumerate(self._devices)]
        return write_timeline(self.trace(), names, path)

    def extra_repr(self) -> str:
        return (f"devices={[str(d) for d in self._devices]}, balance={self.balance}, chunks={self.chunks}, "
                f"micro_batches={self.micro_batches}"
                + (f", checkpoint={self.checkpoint!r}" if self.checkpoint != "never" else ""))


class Plan:
    """``Pipeline.plan``: one row per stage; ``print(model.plan)`` shows the table."""

    def __init__(self, pipe: Pipeline) -> None:
        self.unit_label = pipe._cost_unit
        self.rows = []
        i = 0
        for s, count in enumerate(pipe.balance):
            units = pipe._units[i : i + count]
            i += count
            self.rows.append(dict(
                stage=s, device=str(pipe._devices[s]), units=[u.name for u in units],
                est=sum(u.cost for u in units), params=sum(u.num_params() for u in units),
                act_bytes=_kept_bytes(units, pipe.checkpoint), threads=pipe.threads[s],
            ))
        self.per_token = pipe._sample_shape is None

    def __str__(self) -> str:
        est_head = f"est. time ({self.unit_label})" if self.unit_label == "ms" else f"est. cost ({self.unit_label})"
        act_head = "activations/token" if self.per_token else "activations"
        head = ["stage", "device", "threads", "units", est_head, "params", act_head]
        body = [[
            str(r["stage"]), r["device"], str(r["threads"]), ", ".join(r["units"]),
            f"{r['est'] * (1e3 if self.unit_label == 'ms' else 1e-6):.3f}",
            f"{r['params']:,}", _bytes(r["act_bytes"]),
        ] for r in self.rows]
        widths = [max(len(h), *(len(b[c]) for b in body)) for c, h in enumerate(head)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])

    __repr__ = __str__


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _kept_bytes(units: Sequence[_Unit], checkpoint: str) -> float:
    """Activation bytes a stage keeps for backward (per token, or for the
    profiled sample): everything its units save, or with recomputation its
    input and the dropout masks (the initial states are per chunk, not per
    token, and left out)."""
    if checkpoint == "never":
        return sum(u.act_bytes for u in units)
    per_token = [_flop_model(u)[1] for u in units]
    scale = units[0].act_bytes / per_token[0] if per_token[0] else 1.0  # tokens of the sample
    first = units[0]
    kept = 8.0 if first.kind == "embedding" else float(first.input_size or first.out_size) * _elt(first)
    kept += sum(_flop_model(u)[1] for u in units[1:] if u.kind == "dropout")
    return kept * scale


def _elt(u: _Unit) -> int:
    ps = [p for p in u.params() if p is not None]
    return ps[0].element_size() if ps else 4


def _flop_model(u: _Unit) -> Tuple[float, float]:
    """(forward + backward FLOPs per token, bytes saved for backward per token)."""
    e = _elt(u)
    if u.kind == "lstm":
        g = LayerGeometry(u.input_size, u.hidden_size, u.proj_size)
        H, P, I = g.hidden_size, g.out_size, g.input_size
        fwd = 2 * 4 * H * (I + P) + (2 * P * H if g.projected else 0) + 20 * H
        return 3.0 * fwd, float((I + P + g.workspace_width) * e)
    if u.kind == "linear":
        return 3.0 * 2 * u.input_size * u.out_size, float(u.input_size * e)
    if u.kind == "embedding":
        return 2.0 * u.out_size, 8.0
    return 3.0 * max(u.out_size, 1), float(max(u.out_size, 1) * e)


def _unit_fn(u: _Unit):
    p = u.params()
    if u.kind == "lstm":
        def fn(x):
            B = x.shape[1]
            h0 = x.new_zeros(B, u.out_size)
            c0 = x.new_zeros(B, u.hidden_size)
            return ops.lstm_layer(x, h0, c0, *p)[0]
        return fn
    if u.kind == "embedding":
        m = u.module
        return lambda x: F.embedding(x, p[0], m.padding_idx, None, 2.0, m.scale_grad_by_freq, False)
    if u.kind == "linear":
        return lambda x: F.linear(x, p[0], p[1])
    if u.kind in ("activation", "layer_norm"):
        return u.module
    return lambda x: F.dropout(x, u.p, training=True)


def _profile(u: _Unit, x: Tensor, reps: int = 2) -> Tuple[Tensor, float, float]:
    """Times forward + backward of one unit on x (on the unit's current
    device); returns (its output, seconds, bytes of activations saved)."""
    fn = _unit_fn(u)
    best = math.inf
    y = None
    for _ in range(reps + 1):  # the first run warms up
        xi = x.detach().requires_grad_(x.is_floating_point())
        t = time.perf_counter()
        y = fn(xi)
        if y.requires_grad:
            y.backward(torch.ones_like(y))
        dt = time.perf_counter() - t
        best = min(best, dt)
    with torch.no_grad():
        for w in u.params():
            if w is not None:
                w.grad = None
    _, per_token = _flop_model(u)
    tokens = x.shape[0] * x.shape[1]
    return y.detach(), best, per_token * tokens
