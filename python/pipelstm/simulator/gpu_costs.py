"""A *model* of what each unit costs on one H100: unit costs for GPUs one
cannot calibrate on.

It is not a measurement of an H100. It combines:

* **LSTM layers**: a least-squares fit to *measured* pipelstm layer times
  (forward + backward of one layer, ``python -m pipelstm.bench gpu``'s
  JSON, measured on an H200) of the form ``c0 + T * (a + g*G + w*B*G + p*B*H)``
  with ``G = H * (I + H) / 2`` (the recurrent and input GEMMs' size): a fixed
  cost per call, a latency per step, the weights read each step, the GEMM
  work, the pointwise work. :class:`LstmFit` keeps its error over the
  measured points. Sizes beyond the measured H follow the same formula, so
  the work grows with the FLOPs (H squared) while the per-step latency does
  not: an extrapolation, stated with every figure. The H200 and the H100
  SXM share the GH100 die (SMs, clocks, tensor-core peak); the H100's HBM3
  is slower (3.35 against 4.8 TB/s), so the two memory-bound terms (the
  weights read each step, the pointwise work) are scaled by that ratio.
* **The phases** of a layer's measured forward + backward (the engine's
  forward, backward and weight-gradient tasks): the fixed, latency,
  weight-read and pointwise terms half forward, half backward; the GEMM work
  a third each to forward, backward and the weight gradients (equal FLOPs).
* **Embedding, Linear, Dropout, pointwise units and the loss**: the spec
  sheet (:class:`DeviceSpec`: dense throughput and HBM bandwidth) at a
  stated efficiency, the slower of the FLOP and the memory time, plus a
  kernel launch.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..pipeline.units import Unit, flatten
from .model import UnitInfo

__all__ = ["DeviceSpec", "H100_SXM", "H200", "LstmFit", "fit_lstm", "load_bench_rows", "GpuCosts", "gpu_costs"]

ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class DeviceSpec:
    """A GPU's spec sheet and the efficiencies assumed of it.

    ``flops``: dense throughput per setting (``"fp32"``: without tensor
    cores; ``"bf16"``/``"fp16"``: tensor cores), FLOP/s.
    """

    name: str
    flops: Dict[str, float]
    hbm_bytes_per_s: float
    memory: float
    gemm_efficiency: float = 0.6  # of dense peak, for the Linear layers' GEMMs
    memory_efficiency: float = 0.8  # of HBM bandwidth, for the memory-bound kernels
    launch_s: float = 5e-6  # a kernel launch on the critical path, per phase


H100_SXM = DeviceSpec("H100-SXM", {"fp32": 67e12, "bf16": 989e12, "fp16": 989e12}, 3.35e12, 80e9)
H200 = DeviceSpec("H200", {"fp32": 67e12, "bf16": 989e12, "fp16": 989e12}, 4.8e12, 141e9)


@dataclass
class LstmFit:
    """Seconds of forward + backward of one LSTM layer over ``T`` steps by
    ``B`` sequences: ``c0 + T * (a + g*G + w*B*G + p*B*H)``, ``G = H(I+H)/2``,
    fitted to measured times (``points`` of them, on ``measured_on``)."""

    setting: str
    c0: float
    a: float
    g: float
    w: float
    p: float
    measured_on: str
    points: int
    max_rel_error: float
    rms_rel_error: float
    H_range: List[int]
    T_range: List[int]
    B_range: List[int]
    sources: List[str] = field(default_factory=list)

    def terms(self, T: float, B: float, I: int, H: int) -> Dict[str, float]:
        """The fit's terms (seconds) for a call of ``T`` steps by ``B``."""
        G = H * (I + H) / 2.0
        return dict(fixed=self.c0, latency=T * self.a, weights_read=T * self.g * G, gemm=T * self.w * B * G,
                    pointwise=T * self.p * B * H)

    def seconds(self, T: float, B: float, I: int, H: int) -> float:
        """The fitted time of a call (forward + backward) of ``T`` steps by ``B``."""
        return sum(self.terms(T, B, I, H).values())


def load_bench_rows(paths: Sequence[str]) -> List[dict]:
    """The rows of ``python -m pipelstm.bench gpu`` JSON files, each with its
    file's device name (``"device"``) and name (``"source"``)."""
    rows = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        device = (data.get("device") or {}).get("name", "unknown")
        rows += [dict(r, device=device, source=os.path.basename(path)) for r in data["rows"]]
    return rows


def fit_lstm(rows: Sequence[dict], setting: str) -> LstmFit:
    """Fits :class:`LstmFit` to the one-layer rows of ``setting`` (keys
    ``setting, layers, T, B, H, ours``; I = H), minimising the relative error.

    Raises:
        ValueError: fewer than 5 usable rows, or rows from several devices.
    """
    use = [r for r in rows if r.get("setting") == setting and r.get("layers") == 1 and r.get("ours")]
    if len(use) < 5:
        raise ValueError(f"fit_lstm: {len(use)} one-layer rows of setting {setting!r}; 5 or more needed")
    devices = sorted({r.get("device", "unknown") for r in use})
    if len(devices) > 1:
        raise ValueError(f"fit_lstm: rows from several devices {devices}; fit one device at a time")
    T, B, H = (torch.tensor([float(r[k]) for r in use], dtype=torch.float64) for k in ("T", "B", "H"))
    y = torch.tensor([r["ours"] for r in use], dtype=torch.float64)
    G = H * H  # I = H in the bench
    X = torch.stack([torch.ones_like(T), T, T * G, T * B * G, T * B * H], 1)
    scale = X.abs().max(0).values  # columns of comparable size for the solver
    sol = torch.linalg.lstsq(X / scale / y[:, None], torch.ones_like(y)[:, None]).solution[:, 0] / scale
    sol = sol.clamp(min=0.0)  # a negative cost would be a fitting artefact
    rel = X @ sol / y - 1
    return LstmFit(setting, *[float(v) for v in sol], measured_on=devices[0], points=len(use),
                   max_rel_error=float(rel.abs().max()), rms_rel_error=float(rel.pow(2).mean().sqrt()),
                   H_range=[int(H.min()), int(H.max())], T_range=[int(T.min()), int(T.max())],
                   B_range=[int(B.min()), int(B.max())], sources=sorted({r.get("source", "") for r in use}))


class GpuCosts:
    """The unit costs of a model on one GPU, by the model above (a
    :class:`~pipelstm.simulator.UnitCosts`).

    Args:
        units: the model's units (``pipeline.units.flatten``).
        lstm: the LSTM fit (:func:`fit_lstm`) of the setting.
        setting: ``"fp32"`` (no TF32), ``"bf16"`` or ``"fp16"``: the
            parameters' and activations' dtype.
        spec: the GPU simulated; ``fitted_on`` the one the fit measured
            (their HBM ratio scales the fit's memory-bound terms).
        loss_vocab: the vocabulary of a cross-entropy loss inside the last
            stage (a last unit ``"loss"``), or None for none.

    Raises:
        ValueError: an unknown setting, or a fit of another setting.
    """

    def __init__(self, units: Sequence[Unit], lstm: LstmFit, setting: str = "bf16", spec: DeviceSpec = H100_SXM,
                 fitted_on: DeviceSpec = H200, loss_vocab: Optional[int] = None) -> None:
        if setting not in ELEMENT:
            raise ValueError(f"GpuCosts: setting must be one of {sorted(ELEMENT)}, got {setting!r}")
        if lstm.setting != setting:
            raise ValueError(f"GpuCosts: the LSTM fit is of setting {lstm.setting!r}, not {setting!r}")
        self.device = f"{spec.name} (model)"
        self.setting, self.spec, self.fit = setting, spec, lstm
        self.elt = ELEMENT[setting]
        self.memory_ratio = fitted_on.hbm_bytes_per_s / spec.hbm_bytes_per_s
        self._units = list(units)
        self.loss_vocab = loss_vocab
        # Each unit's output width (a Dropout keeps the width it gets).
        self._widths, width = [], 0
        for u in self._units:
            width = u.out_size or width
            self._widths.append(width)
        infos = [UnitInfo(u.name, u.kind, u.num_params() * self.elt,
                          2 * u.out_size * self.elt if u.kind == "lstm" else 0) for u in self._units]
        if loss_vocab is not None:
            infos.append(UnitInfo("loss", "cross_entropy", 0))
        self._infos = infos

    def units(self) -> Sequence[UnitInfo]:
        """The units in order (the loss last, with ``loss_vocab``)."""
        return self._infos

    def _width(self, unit: int) -> int:
        return self.loss_vocab if unit >= len(self._units) else self._widths[unit]

    def _spec_time(self, flops: float, nbytes: float) -> float:
        s = self.spec
        return s.launch_s + max(flops / (s.flops[self.setting] * s.gemm_efficiency),
                                nbytes / (s.hbm_bytes_per_s * s.memory_efficiency))

    def seconds(self, unit: int, phase: str, t: int, b: int) -> float:
        """Seconds of ``phase`` of unit ``unit`` for ``t`` steps by ``b`` sequences."""
        if phase not in ("forward", "backward", "weights"):
            raise ValueError(f"GpuCosts.seconds: phase must be forward, backward or weights, got {phase!r}")
        n, e = float(t) * b, self.elt
        if unit >= len(self._units):  # the loss: log-softmax over the vocabulary, then its gradient
            V = self.loss_vocab
            return {"forward": self._spec_time(5 * n * V, 3 * n * V * e),
                    "backward": self._spec_time(2 * n * V, 2 * n * V * e), "weights": 0.0}[phase]
        u = self._units[unit]
        if u.kind == "lstm":
            terms = self.fit.terms(t, b, u.input_size, u.hidden_size)
            terms["weights_read"] *= self.memory_ratio
            terms["pointwise"] *= self.memory_ratio
            serial = terms["fixed"] + terms["latency"] + terms["weights_read"] + terms["pointwise"]
            return terms["gemm"] / 3 + (0.0 if phase == "weights" else serial / 2)
        if u.kind == "linear":
            i, o = u.input_size, u.out_size
            return self._spec_time(2 * n * i * o, (n * i + n * o + i * o) * e)
        if u.kind == "embedding":
            V, E = u.module.num_embeddings, u.out_size
            return {"forward": self._spec_time(0, 2 * n * E * e), "backward": 0.0,  # its input is indices
                    "weights": self._spec_time(n * E, (2 * n * E + V * E) * e)}[phase]
        # dropout, activation, layer_norm: read and write the width (and a mask)
        w = self._widths[unit]
        return 0.0 if phase == "weights" else self._spec_time(5 * n * w, n * w * (2 * e + 1))

    def output_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes of the unit's output for ``t`` steps by ``b`` (the loss: a scalar)."""
        return 4.0 if unit >= len(self._units) else float(t) * b * self._width(unit) * self.elt

    def saved_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes the unit's forward keeps for its backward: the FLOP cost
        model's bytes per token (``Unit.cost_per_token``) in this dtype; the
        loss keeps its log-probabilities."""
        n = float(t) * b
        if unit >= len(self._units):
            return n * (self.loss_vocab * self.elt + 8)
        u = self._units[unit]
        per_token = u.cost_per_token()[1]
        if u.is_dropout or u.kind in ("activation", "layer_norm"):
            per_token = self._widths[unit] * u.element_size()
        return n * (per_token if u.kind == "embedding" else per_token / u.element_size() * self.elt)

    def describe(self) -> Dict[str, object]:
        """The model's assumptions and the LSTM fit, as plain data (for JSON)."""
        return dict(device=self.device, setting=self.setting, spec=asdict(self.spec),
                    memory_bound_scale=self.memory_ratio, lstm_fit=asdict(self.fit))


def gpu_costs(model: nn.Sequential, lstm: LstmFit, setting: str = "bf16", loss_vocab: Optional[int] = None,
              spec: DeviceSpec = H100_SXM) -> GpuCosts:
    """:class:`GpuCosts` of ``model`` (an ``nn.Sequential`` the pipeline
    takes; build it under ``torch.device("meta")`` to allocate nothing).

    Raises:
        ValueError: a module the pipeline does not run, or a bad setting.
    """
    return GpuCosts(flatten(model.named_children()), lstm, setting, spec, loss_vocab=loss_vocab)
