"""``FittedCosts``: unit costs fitted to measurements, saved and loaded as JSON.

Each unit's seconds per phase follow ``c0 + c1 * t + c2 * t * b`` for an
item of ``t`` steps by ``b`` sequences (a fixed cost, the recurrence's
per-step cost, the work per token), fitted by non-negative least squares
to calibration runs (``calibrate.py``) and weighted by the inverse of the
measured time so that every size counts alike (relative error). At a size
that was measured the measurement itself is used: the units' kernels
change algorithm with the size (docs/dispatch.md), which no three
coefficients follow, so the fit only covers sizes between. Bytes:
``output_bytes`` is the unit's output per token times ``t * b``;
``saved_bytes`` follows ``s0 + s1 * b + s2 * t * b`` (states per sequence,
activations per token), fitted the same way: what the unit keeps beyond
the unit before it in the same stage (its input, which that one kept as
its output, counts once); ``first_saved_bytes``, all it keeps, as the
first unit of a stage of its own.
"""

import itertools
import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .model import PHASES, UnitInfo

__all__ = ["FittedCosts", "UnitFit", "fit_seconds", "fit_bytes", "FORMAT"]

FORMAT = "pipelstm.simulator.costs/1"


def _nnls(rows: List[List[float]], y: List[float]) -> Tuple[List[float], float]:
    """Non-negative coefficients minimising the relative squared error, by
    least squares on every subset of the (three) columns, the best one
    without negative coefficients kept; (coefficients, worst relative error)."""
    A = torch.tensor(rows, dtype=torch.float64)
    Y = torch.tensor(y, dtype=torch.float64)
    # relative error, with a floor so that a sample measured as 0 (a
    # difference of two runs) does not pin the fit to 0
    w = 1.0 / Y.abs().clamp_min(max(float(Y.abs().median()) * 0.05, 1e-12))
    Aw, Yw = A * w[:, None], Y * w
    best, best_res = torch.zeros(A.shape[1], dtype=torch.float64), float((Yw ** 2).sum())
    for n in range(1, A.shape[1] + 1):
        for cols in itertools.combinations(range(A.shape[1]), n):
            sol = torch.linalg.lstsq(Aw[:, cols], Yw[:, None]).solution[:, 0]
            if bool((sol < 0).any()):
                continue
            coef = torch.zeros(A.shape[1], dtype=torch.float64)
            coef[list(cols)] = sol
            res = float(((Aw @ coef - Yw) ** 2).sum())
            if res < best_res:
                best, best_res = coef, res
    worst = float(((A @ best - Y).abs() * w).max()) if len(y) else 0.0
    return [float(c) for c in best], worst


def fit_seconds(samples: Sequence[Tuple[int, int, float]]) -> Tuple[List[float], float]:
    """``(c0, c1, c2)`` of ``c0 + c1*t + c2*t*b`` from ``(t, b, seconds)``
    samples, and the fit's worst relative error on them."""
    return _nnls([[1.0, t, t * b] for t, b, _ in samples], [s for _, _, s in samples])


def fit_bytes(samples: Sequence[Tuple[int, int, float]]) -> Tuple[List[float], float]:
    """``(s0, s1, s2)`` of ``s0 + s1*b + s2*t*b`` from ``(t, b, bytes)``
    samples, and the fit's worst relative error (0 where all are 0)."""
    y = [float(v) for _, _, v in samples]
    if not any(y):
        return [0.0, 0.0, 0.0], 0.0
    return _nnls([[1.0, b, t * b] for t, b, _ in samples], y)


@dataclass
class UnitFit:
    """One unit's fitted costs (see the module's docstring)."""

    info: UnitInfo
    seconds: Dict[str, List[float]]  # phase -> (c0, c1, c2)
    out_bytes_per_token: float
    saved: List[float]  # (s0, s1, s2)
    error: Dict[str, float] = field(default_factory=dict)  # phase or "saved" -> worst relative error of its fit
    measured: Dict[str, Dict[str, float]] = field(default_factory=dict)  # "t,b" -> phase -> seconds
    saved_first: Optional[List[float]] = None  # (s0, s1, s2) as the first unit of a stage (None: as ``saved``)


class FittedCosts:
    """:class:`~pipelstm.simulator.UnitCosts` from fitted coefficients.

    Args:
        device: where the measurements ran, e.g. ``"cpu"``.
        fits: per unit, in order (the loss last, if any).
        threads: intra-op threads each measured stage had.
        pass_gap_s: seconds between the end of the forward pass and the
            start of the backward (autograd, outside the engine).
        step_overhead_s: the rest of a step outside the engine's passes.
        meta: where and how it was measured (free-form, kept in the JSON).
    """

    def __init__(self, device: str, fits: Sequence[UnitFit], *, threads: int = 0, pass_gap_s: float = 0.0,
                 step_overhead_s: float = 0.0, meta: Dict[str, object] = None) -> None:
        self.device = device
        self.fits = list(fits)
        self.threads = threads
        self.pass_gap_s = pass_gap_s
        self.step_overhead_s = step_overhead_s
        self.meta = dict(meta or {})

    def units(self) -> List[UnitInfo]:
        """The units in order."""
        return [f.info for f in self.fits]

    def _fit(self, unit: int) -> UnitFit:
        if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit < len(self.fits):
            raise IndexError(f"FittedCosts: unit must be an index in [0, {len(self.fits)}), got {unit!r}")
        return self.fits[unit]

    def seconds(self, unit: int, phase: str, t: int, b: int) -> float:
        """Seconds of ``phase`` of unit ``unit`` for an item of ``t`` x ``b``."""
        if phase not in PHASES:
            raise ValueError(f"FittedCosts.seconds: phase must be one of {PHASES}, got {phase!r}")
        fit = self._fit(unit)
        at = fit.measured.get(f"{t},{b}")
        if at is not None:
            return at[phase]
        c0, c1, c2 = fit.seconds[phase]
        return c0 + c1 * t + c2 * t * b

    def output_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes of the unit's output for an item of ``t`` x ``b``."""
        return self._fit(unit).out_bytes_per_token * t * b

    def saved_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes the unit's forward keeps for its backward, for the item."""
        s0, s1, s2 = self._fit(unit).saved
        return s0 + s1 * b + s2 * t * b

    def first_saved_bytes(self, unit: int, t: int, b: int) -> float:
        """Bytes the unit's forward keeps as the first unit of a stage in a
        process (or on a device) of its own: its input too, which the unit
        before it, on another stage, keeps on its own side."""
        fit = self._fit(unit)
        if fit.saved_first is None:
            return self.saved_bytes(unit, t, b)
        s0, s1, s2 = fit.saved_first
        return s0 + s1 * b + s2 * t * b

    def scaled(self, factor: float, device: Optional[str] = None) -> "FittedCosts":
        """These costs on a device ``factor`` times as slow (every second
        times ``factor``; bytes alike), named ``device``.

        Raises:
            ValueError: ``factor`` is not a positive number.
        """
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise ValueError(f"FittedCosts.scaled: factor must be a positive number, got {factor!r}")
        d = self.to_dict()
        d["device"] = device or self.device
        d["pass_gap_s"] *= factor
        d["step_overhead_s"] *= factor
        for u in d["units"]:
            u["seconds"] = {ph: [c * factor for c in cs] for ph, cs in u["seconds"].items()}
            u["measured"] = {tb: {ph: v * factor for ph, v in at.items()} for tb, at in u["measured"].items()}
        return FittedCosts.from_dict(d)

    def worst_fit_error(self) -> float:
        """The largest relative error of any fit on its own measurements
        (the seconds of each phase, the saved bytes)."""
        return max((e for f in self.fits for e in f.error.values()), default=0.0)

    # --- JSON ------------------------------------------------------------------------

    def to_dict(self) -> Dict[str, object]:
        """A JSON-able description (``from_dict`` reads it back)."""
        return dict(format=FORMAT, device=self.device, threads=self.threads, pass_gap_s=self.pass_gap_s,
                    step_overhead_s=self.step_overhead_s, meta=self.meta,
                    units=[dict(asdict(f.info), seconds=f.seconds, out_bytes_per_token=f.out_bytes_per_token,
                                saved=f.saved, saved_first=f.saved_first, error=f.error, measured=f.measured)
                           for f in self.fits])

    @classmethod
    def from_dict(cls, d: Dict[str, object]) -> "FittedCosts":
        """The costs ``to_dict`` described.

        Raises:
            ValueError: not such a description (another format, a missing phase).
        """
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"FittedCosts: expected a calibration of format {FORMAT!r}, got {got!r}")
        fits = []
        for u in d["units"]:
            if set(u["seconds"]) != set(PHASES):
                raise ValueError(f"FittedCosts: unit {u.get('name')!r} lacks a phase: has {sorted(u['seconds'])}")
            info = UnitInfo(name=u["name"], kind=u["kind"], param_bytes=int(u["param_bytes"]),
                            state_bytes_per_row=int(u.get("state_bytes_per_row", 0)))
            fits.append(UnitFit(info, {p: list(map(float, c)) for p, c in u["seconds"].items()},
                                float(u["out_bytes_per_token"]), list(map(float, u["saved"])), dict(u.get("error", {})),
                                {tb: {p: float(v) for p, v in ph.items()} for tb, ph in u.get("measured", {}).items()},
                                u.get("saved_first")))
        return cls(d["device"], fits, threads=int(d.get("threads", 0)), pass_gap_s=float(d.get("pass_gap_s", 0.0)),
                   step_overhead_s=float(d.get("step_overhead_s", 0.0)), meta=d.get("meta", {}))

    def save(self, path: str) -> None:
        """Writes the calibration to ``path`` (JSON)."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "FittedCosts":
        """Reads a calibration ``save`` wrote (e.g. on another machine)."""
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def __repr__(self) -> str:
        return (f"FittedCosts(device={self.device!r}, threads={self.threads}, units="
                f"{[f.info.name for f in self.fits]}, worst fit error {self.worst_fit_error():.1%})")
