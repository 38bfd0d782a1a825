"""What a model flattens into: *units*, and what pipelstm knows of each kind.

A pipeline runs a ``Sequential``'s children as units, each run natively by
the C++ engine (``csrc/pipeline/units.cpp``): every layer of a multi-layer
LSTM is a unit of its own, and so is the dropout between two of its layers;
``Embedding``, ``Linear``, ``Dropout``, ``LayerNorm``, ``RMSNorm`` and the
activations are one unit each; ``Identity`` is none.

The engine's table of kinds (``_C.pipeline.UNIT_KINDS``, which each
``csrc/pipeline/units/<kind>.cpp`` registers itself into) gives each kind's
parameter slots, the ``UnitSpec`` options it reads and whether it carries a
state; two tables here say the rest. ``MODULES``: for each module type, the
units it flattens into (with the values of their options). ``KINDS``: for
each kind of unit (the engine's ``UnitKind`` of the same name), its cost per
token for the balancing cost model and a plain-torch forward for the
profiler (unit_kinds.py). A new kind is its file there, its entries here
and its test.
``ACTIVATIONS``: the activation modules the engine runs, each by one of the
names of the engine's table (``_C.pipeline.ACTIVATIONS``, from
``csrc/pipeline/units/activation.cpp``); a new activation is a row there,
an entry here and its test.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import _C
from ..geometry import LayerGeometry
from ..locked_dropout import LockedDropout
from .unit_kinds import DROPOUT_KINDS, KINDS, LSTM_KINDS, Kind, slots

__all__ = ["Unit", "Kind", "KINDS", "LSTM_KINDS", "MODULES", "ACTIVATIONS", "SUPPORTED", "flatten", "loss_spec"]

_engine = _C.pipeline


@dataclass
class Unit:
    """One unit of a pipeline: a piece of ``module`` that one stage runs.

    ``param_names`` are the unit's parameter slots in the engine's order
    (``None`` where a slot is empty, e.g. a Linear without bias); ``options``
    the values of the engine ``UnitSpec`` options of its kind (the kind's
    ``options`` in the engine's table, e.g. a Dropout's ``p``); ``cost``
    and ``act_bytes`` are filled in by the balancing (pipeline/balance.py),
    ``device`` by the placement (pipeline/placement.py).
    """

    kind: str  # a key of KINDS: "lstm", "layernorm_lstm", "embedding", "linear", "dropout", "layer_norm", ...
    name: str
    module: nn.Module
    param_names: List[Optional[str]]
    layer: int = -1  # LSTM (of either kind): index among all LSTM layers of the model
    input_size: int = 0
    hidden_size: int = 0
    proj_size: int = 0
    options: Dict[str, Any] = field(default_factory=dict)
    out_size: int = 0
    cost: float = 0.0  # estimated seconds (profiled) or FLOPs per token (cost model)
    act_bytes: float = 0.0  # saved for backward, per token (or in all, with a sample)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def p(self) -> float:
        """A dropout unit's probability of zeroing an element (0 for other kinds)."""
        return self.options.get("p", 0.0)

    @property
    def is_dropout(self) -> bool:
        """Whether it is a dropout (per element, or per sequence: variational)."""
        return self.kind in DROPOUT_KINDS

    @property
    def activation(self) -> str:
        """An activation unit's name in the engine's table, e.g. ``"gelu_tanh"`` (``""`` for other kinds)."""
        return self.options.get("activation", "")

    def params(self) -> List[Optional[Tensor]]:
        """The parameter slots, looked up on the module by name each call."""
        return [None if n is None else getattr(self.module, n) for n in self.param_names]

    def params_for_call(self, training: bool, seed: Optional[int] = None) -> List[Optional[Tensor]]:
        """The slots a pass computes with: ``params()``, with an LSTM layer's
        ``weight_hh`` dropped while training where its module asks for
        ``weight_dropout`` (one mask per pass, drawn from ``seed``, as the
        module's own call draws one per call; ``pipelstm.regularisation``)."""
        ps = self.params()
        regularisation = getattr(self.module, "_regularisation", None)
        if self.kind not in LSTM_KINDS or regularisation is None:
            return ps
        return regularisation.layer_weights(ps, training, seed)

    def num_params(self) -> int:
        """The number of parameter elements of the unit."""
        return sum(p.numel() for p in self.params() if p is not None)

    def element_size(self) -> int:
        """Bytes per element of the unit's activations: its parameters' (4 without parameters)."""
        ps = [p for p in self.params() if p is not None]
        return ps[0].element_size() if ps else 4

    @property
    def has_state(self) -> bool:
        """Whether the unit has initial and final states (an LSTM layer)."""
        return _engine.UNIT_KINDS[self.kind]["has_state"]

    def cost_per_token(self) -> Tuple[float, float]:
        """(forward + backward FLOPs per token, bytes saved for backward per token)."""
        return KINDS[self.kind].cost(self)

    def spec(self, state_index: int = -1) -> "_engine.UnitSpec":
        """The engine's description of this unit; ``state_index``: an LSTM
        layer's slot among the initial and final states."""
        kw = dict(self.options)
        assert set(kw) <= set(_engine.UNIT_KINDS[self.kind]["options"]), (self.kind, kw)
        if self.has_state:
            kw["state_index"] = state_index
        return _engine.UnitSpec(getattr(_engine.UnitKind, self.kind), self.name, **kw)

    def reference(self) -> Callable[[Tensor], Tensor]:
        """The unit's forward in plain torch (LSTM layers from zero states),
        which the profiler times."""
        return KINDS[self.kind].reference(self)


# The activations the engine runs natively: module type (exactly) -> its name there.
ACTIVATIONS: Dict[type, Callable[[nn.Module], str]] = {
    nn.ReLU: lambda m: "relu",
    nn.Tanh: lambda m: "tanh",
    nn.Sigmoid: lambda m: "sigmoid",
    nn.GELU: lambda m: "gelu" if m.approximate == "none" else "gelu_tanh",
    nn.SiLU: lambda m: "silu",
    nn.Mish: lambda m: "mish",
}
SUPPORTED = ("Embedding, LSTM (pipelstm.LSTM, pipelstm.LayerNormLSTM or nn.LSTM), Dropout, pipelstm.LockedDropout, "
             "Linear, LayerNorm and RMSNorm (over the last dimension), ReLU, Tanh, Sigmoid, GELU, SiLU, Mish and "
             "Identity")


def _present_slots(kind: str, child: nn.Module) -> List[Optional[str]]:
    """The kind's slots, None where ``child`` has no such parameter (e.g. no bias)."""
    return [slot if getattr(child, slot, None) is not None else None for slot in slots(kind)]


def _lstm_units(name: str, child: nn.RNNBase, before: Sequence[Unit]) -> List[Unit]:
    if child.mode != "LSTM":
        raise ValueError(f"Pipeline: module {name!r} is a {child.mode}; only LSTMs are supported")
    if child.bidirectional:
        raise ValueError(
            f"Pipeline: module {name!r} is a bidirectional LSTM, which cannot be pipelined over time "
            "chunks (its reverse direction needs the end of the sequence before the start); "
            "use unidirectional LSTMs"
        )
    regularisation = getattr(child, "_regularisation", None)
    prefix = f"{name}." if name else ""
    first = sum(u.kind in LSTM_KINDS for u in before)
    H, P = child.hidden_size, child.proj_size
    # pipelstm.LayerNormLSTM's layers are a kind of their own (their norms' eps an option)
    kind = getattr(child, "_pipeline_unit_kind", "lstm")
    options = dict(eps=child.eps) if kind == "layernorm_lstm" else {}
    if regularisation is not None and regularisation.zoned:  # each item draws its own masks
        options.update(zoneout_c=regularisation.zoneout[0], zoneout_h=regularisation.zoneout[1])
    units = []
    for l in range(child.num_layers):
        g = LayerGeometry(child.input_size if l == 0 else (P or H), H, P)
        names = [f"{slot}_l{l}" if getattr(child, f"{slot}_l{l}", None) is not None else None
                 for slot in slots(kind)]
        units.append(Unit(kind, f"{prefix}l{l}", child, names, layer=first + l, input_size=g.input_size,
                          hidden_size=H, proj_size=P, out_size=g.out_size, options=dict(options)))
        if child.dropout > 0 and l < child.num_layers - 1:
            variational = regularisation is not None and regularisation.dropout_mode == "variational"
            units.append(Unit("variational_dropout" if variational else "dropout", f"{prefix}dropout{l}", child, [],
                              options=dict(p=float(child.dropout)), out_size=g.out_size))
    return units


def _locked_dropout_units(name: str, child: LockedDropout, before: Sequence[Unit]) -> List[Unit]:
    if child.batch_first:
        raise ValueError(f"Pipeline: module {name!r} is a LockedDropout with batch_first=True; a Pipeline's "
                         "activations are time-major: use batch_first=False")
    return [Unit("variational_dropout", name, child, [], options=dict(p=child.p))]


def _embedding_units(name: str, child: nn.Embedding, before: Sequence[Unit]) -> List[Unit]:
    if child.max_norm is not None or child.sparse:
        raise ValueError(f"Pipeline: Embedding {name!r}: max_norm and sparse are not supported")
    pad = -1 if child.padding_idx is None else child.padding_idx
    return [Unit("embedding", name, child, list(slots("embedding")), out_size=child.embedding_dim,
                 options=dict(padding_idx=pad, scale_grad_by_freq=child.scale_grad_by_freq))]


def _linear_units(name: str, child: nn.Linear, before: Sequence[Unit]) -> List[Unit]:
    return [Unit("linear", name, child, _present_slots("linear", child), input_size=child.in_features,
                 out_size=child.out_features)]


def _normalized_width(name: str, child: nn.Module) -> int:
    """The width a LayerNorm or RMSNorm normalises, which must be the last dimension alone."""
    if len(child.normalized_shape) != 1:
        raise ValueError(f"Pipeline: {type(child).__name__} {name!r} must normalise over the last dimension only, "
                         f"got normalized_shape={tuple(child.normalized_shape)}")
    return child.normalized_shape[0]


def _layer_norm_units(name: str, child: nn.LayerNorm, before: Sequence[Unit]) -> List[Unit]:
    width = _normalized_width(name, child)
    return [Unit("layer_norm", name, child, _present_slots("layer_norm", child), input_size=width, out_size=width,
                 options=dict(eps=float(child.eps)))]


def _rms_norm_units(name: str, child: nn.RMSNorm, before: Sequence[Unit]) -> List[Unit]:
    width = _normalized_width(name, child)
    # eps=None: torch's default, the machine epsilon of the input's dtype (-1 to the engine).
    eps = -1.0 if child.eps is None else float(child.eps)
    return [Unit("rms_norm", name, child, _present_slots("rms_norm", child), input_size=width, out_size=width,
                 options=dict(eps=eps))]


def _activation_units(name: str, child: nn.Module, before: Sequence[Unit]) -> List[Unit]:
    width = before[-1].out_size if before else 0
    return [Unit("activation", name, child, [], options=dict(activation=ACTIVATIONS[type(child)](child)),
                 input_size=width, out_size=width)]


_Flatten = Callable[[str, nn.Module, Sequence[Unit]], List[Unit]]

# Module type (and its subclasses) -> its units, given the units before it.
# The activations of ACTIVATIONS match their exact type.
MODULES: Dict[type, _Flatten] = {
    nn.Identity: lambda name, child, before: [],
    nn.RNNBase: _lstm_units,
    nn.Embedding: _embedding_units,
    nn.Linear: _linear_units,
    nn.Dropout: lambda name, child, before: [Unit("dropout", name, child, [], options=dict(p=float(child.p)))],
    LockedDropout: _locked_dropout_units,
    nn.LayerNorm: _layer_norm_units,
    nn.RMSNorm: _rms_norm_units,
}


def _flattener(child: nn.Module) -> Optional[_Flatten]:
    for module_type, fn in MODULES.items():
        if isinstance(child, module_type):
            return fn
    return _activation_units if type(child) in ACTIVATIONS else None


# What a module's class may redefine and still compute as the class the
# pipeline runs it as: anything but these.
_COMPUTING = ("forward", "_run_layers", "_layers", "_direction")


def _own_computation(child: nn.Module) -> Optional[str]:
    """``"Class.method"`` where a class between ``child``'s and the one its
    units stand for (torch's own, or a pipelstm class that declares its
    units' kind) redefines how it computes, if one does: the pipeline would
    run the units of the class it derives from, not that code."""
    mro = type(child).__mro__
    for i, base in enumerate(mro):
        # torch's module classes (torch.nn.modules); a parametrization's class
        # (torch.nn.utils.parametrize) only wraps the one it derives from
        if "_pipeline_unit_kind" in vars(base) or base.__module__.startswith("torch.nn.modules."):
            return next((f"{c.__name__}.{h}" for c in mro[:i] for h in _COMPUTING if h in vars(c)), None)
    return None


def flatten(children: Iterable[Tuple[str, nn.Module]]) -> List[Unit]:
    """The units of a Sequential's ``named_children()``.

    A module named ``""`` gives its units without a prefix: one LSTM on its
    own (``pipelstm.LSTM(devices=...)``) flattens into ``l0, dropout0, l1, ...``.

    Raises:
        ValueError: a module the engine does not run (naming it and the
            supported ones), a subclass of one that computes differently
            (its own ``forward``), a GRU, a bidirectional LSTM, or no units
            at all.
    """
    units: List[Unit] = []
    for name, child in children:
        own = _own_computation(child)
        if own is not None:
            raise ValueError(
                f"Pipeline: module {name!r} ({type(child).__name__}) computes in its own way ({own}), which a "
                f"pipeline cannot run: it runs {SUPPORTED} as those modules compute. Use the module it derives "
                "from, or keep this one outside the Sequential given to the pipeline"
            )
        fn = _flattener(child)
        if fn is None:
            raise ValueError(
                f"Pipeline: module {name!r} ({type(child).__name__}) is not supported; a pipeline is a "
                f"Sequential of {SUPPORTED}"
            )
        units += fn(name, child, units)
    if not units:
        raise ValueError("Pipeline: the model has no units")
    return units


def loss_spec(loss_fn: Optional[nn.Module]) -> Optional[dict]:
    """The engine's loss unit for ``loss_fn`` (``nn.CrossEntropyLoss``): its
    ``UnitSpec`` arguments (``ignore_index``, ``mean``), or None without one.

    Raises:
        ValueError: another loss, or class weights, label smoothing or
            ``reduction="none"``.
    """
    if loss_fn is None:
        return None
    if type(loss_fn) is not nn.CrossEntropyLoss:
        raise ValueError(f"Pipeline: loss_fn must be an nn.CrossEntropyLoss, got {type(loss_fn).__name__}")
    if loss_fn.weight is not None or loss_fn.label_smoothing != 0.0 or loss_fn.reduction not in ("mean", "sum"):
        raise ValueError("Pipeline: loss_fn supports ignore_index and reduction='mean' or 'sum'; not class weights, "
                         f"label_smoothing or reduction={loss_fn.reduction!r}")
    return dict(ignore_index=int(loss_fn.ignore_index), mean=loss_fn.reduction == "mean")
