"""``calibrate``: what each of a model's units costs, measured on the engine itself.

The whole model (as ``pipelstm.Pipeline`` flattens it into units; the
loss, if any, last) runs as a one-stage
:class:`~pipelstm.pipeline.core.PipelineCore` with K = M = 1 on the
device, one training step at each item size ``(t, b)`` (after an untimed
one of the same size: a training loop's steady step), under
``torch.profiler``: the engine's ranges name every unit's forward,
backward (the data gradients) and parameter gradients
(``profile_range.h``), so each unit is timed in place, after the unit
before it, as a stage runs it. The median over ``repeats`` rounds (after an
untimed one; each round runs every size once, so that what else the
machine does falls on all of them alike) is fitted per unit and phase
(``costs.fit_seconds``).

Bytes come from the real tensors: a unit's output from its output, what
its forward keeps from the engine's ``saved_activation_bytes`` of the
unit alone, less what it shares with the unit before it (its input, which
that unit saved too), from a run of the pair; the loss's from a run of the
decoder with and without it.

Two overheads outside the engine come from the same step at the largest
size: the gap between the forward pass and the backward (autograd), and
the rest of the step beyond the two passes.
"""

import contextlib
import copy
import os
import re
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from ..pipeline.core import PipelineCore
from ..pipeline.prologue import prepare
from ..pipeline.units import LSTM_KINDS
from .costs import FittedCosts, UnitFit, fit_bytes, fit_seconds
from .model import PHASES, UnitInfo

__all__ = ["calibrate", "Calibrator", "model_step", "DEFAULT_SIZES"]

# Item sizes (t, b) measured by default.
DEFAULT_SIZES = ((4, 2), (16, 4), (32, 8), (64, 16), (16, 16), (64, 4))


# The engine's range of one unit's work (profile_range.h).
_UNIT_RANGE = re.compile(r"^pipelstm (forward|backward|weights) stage 0 unit (\d+) ")


def _unit_seconds(events) -> Dict[Tuple[int, str], float]:
    """Seconds of each (unit, phase) among a profile's events: its range on
    the host, or the time its kernels took on the device where that is
    longer (a CUDA unit returns once it has launched them)."""
    out: Dict[Tuple[int, str], float] = {}
    for e in events:
        m = _UNIT_RANGE.match(e.name)
        if m:
            key = (int(m[2]), m[1])
            host = e.time_range.end - e.time_range.start
            out[key] = out.get(key, 0.0) + max(host, getattr(e, "device_time_total", 0)) / 1e6
    return out


def _run(core: PipelineCore, x: Tensor, target: Optional[Tensor]) -> Tuple[Tensor, int]:
    """One forward with grad and its backward; (the output, bytes kept for backward)."""
    L = core.num_layers
    out, _, _ = core.run(x, [None] * L, [None] * L, True, target)
    kept = core.saved_activation_bytes
    (out if target is not None else out.float().sum()).backward()
    return out.detach(), kept


def _zero_grads(core: PipelineCore) -> None:
    for u in core.units:
        for p in u.params():
            if p is not None:
                p.grad = None


def _sample(first, t: int, b: int, g: torch.Generator, device: torch.device, vocab_input: Optional[int]) -> Tensor:
    """A ``[t, b]`` input for a model whose first unit is ``first``: indices
    for an Embedding (below ``vocab_input``, default its size), else
    features in its parameters' dtype."""
    if first.kind == "embedding":
        return torch.randint(0, vocab_input or first.module.num_embeddings, (t, b), generator=g).to(device)
    return torch.randn(t, b, first.input_size, generator=g).to(device, first.params()[0].dtype)


def model_step(model: nn.Sequential, loss_fn: Optional[nn.Module] = None, size: Tuple[int, int] = (64, 8),
               threads: int = 1, vocab_input: Optional[int] = None) -> Callable[[], None]:
    """One training step of the whole ``model`` (a copy) on the CPU engine at
    one item size ``(t, b)``, as a calibration round runs it: the work
    ``loopback.compute_sharing`` times beside itself.

    Returns:
        A function that runs the step (forward, loss or a sum, backward).
    """
    _check(model, loss_fn, "cpu", threads, [size] * 3, 1)
    prepared = prepare("calibrate", copy.deepcopy(model).named_children(), ["cpu"], chunks=1, micro_batches=1,
                       loss_fn=loss_fn)
    units, cpu = prepared.units, torch.device("cpu")
    whole = PipelineCore(units, [cpu], [len(units)], [threads], loss=prepared.loss, who="calibrate")
    g = torch.Generator().manual_seed(0)
    x = _sample(units[0], size[0], size[1], g, cpu, vocab_input)
    target = None
    if prepared.loss is not None:  # classes: the width of the units' output
        out, _ = _run(PipelineCore(units, [cpu], [len(units)], [threads], who="calibrate"), x, None)
        target = torch.randint(0, out.shape[-1], tuple(size), generator=g)

    def step() -> None:
        _zero_grads(whole)
        _run(whole, x, target)

    return step


def _check(model, loss_fn, device, threads, sizes, repeats) -> List[Tuple[int, int]]:
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"calibrate: model must be an nn.Sequential (as pipelstm.Pipeline takes), "
                        f"got {type(model).__name__}")
    if loss_fn is not None and type(loss_fn) is not nn.CrossEntropyLoss:
        raise ValueError(f"calibrate: loss_fn must be an nn.CrossEntropyLoss or None, got {type(loss_fn).__name__}")
    torch.device(device)  # raises on a malformed device
    for name, v in (("threads", threads), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"calibrate: {name} must be a positive int, got {v!r}")
    sizes = [tuple(s) for s in sizes]
    if len(sizes) < 3 or any(len(s) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in s)
                             for s in sizes):
        raise ValueError(f"calibrate: sizes must be at least 3 (t, b) pairs of positive ints, got {sizes}")
    return sizes


class Calibrator:
    """A calibration in rounds (``calibrate`` runs them all at once; a
    benchmark may interleave them with the steps it measures, so that both
    see the same machine). Arguments as :func:`calibrate`'s.

    The constructor runs one untimed round (and measures the bytes); every
    :meth:`round` then runs the whole model once at every size;
    :meth:`costs` fits the medians of the rounds so far.
    """

    def __init__(self, model: nn.Sequential, *, loss_fn: Optional[nn.Module] = None, device: str = "cpu",
                 threads: int = 1, sizes: Sequence[Tuple[int, int]] = DEFAULT_SIZES,
                 vocab_input: Optional[int] = None) -> None:
        self.sizes = _check(model, loss_fn, device, threads, sizes, 1)
        self.model = copy.deepcopy(model)
        prepared = prepare("calibrate", self.model.named_children(), [device], chunks=1, micro_batches=1,
                           loss_fn=loss_fn)
        self.units, self.loss, self.device, self.threads = prepared.units, prepared.loss, torch.device(device), threads
        first = self.units[0]
        self.cores = [self._core([u]) for u in self.units]
        self.loss_core = self._core([self.units[-1]], self.loss) if self.loss is not None else None
        self.whole = self._core(self.units, self.loss)
        self.runs = []  # (t, b, core index (len(cores): the loss core), input, target)
        self.steps = []  # (t, b, the model's input, target): what a round times
        self.info = {}  # (core index, t, b) -> (output bytes per token, kept bytes)
        for t, b in self.sizes:
            g = torch.Generator().manual_seed(t * 1000 + b)
            x = first_x = _sample(first, t, b, g, self.device, vocab_input)
            for i, core in enumerate(self.cores):
                xi = x.detach().requires_grad_(x.is_floating_point())
                out, kept = _run(core, xi, None)
                self.runs.append((t, b, i, xi, None))
                self.info[(i, t, b)] = (out.numel() * out.element_size() / (t * b), kept)
                if i == len(self.cores) - 1 and self.loss_core is not None:
                    target = torch.randint(0, out.shape[-1], (t, b), generator=g).to(self.device)
                    self.runs.append((t, b, len(self.cores), xi, target))
                    self.info[(len(self.cores), t, b)] = (0.0, _run(self.loss_core, xi, target)[1])
                x = out
            self.steps.append((t, b, first_x, target if self.loss_core is not None else None))
            _run(self.whole, first_x, self.steps[-1][3])
        # What a unit keeps beyond what the unit before it keeps: a unit
        # saves its input, which the unit before saved as its output, and
        # one stage keeps that storage once (a pair of units, less the first).
        ins = {(i, t, b): xi for t, b, i, xi, _ in self.runs}
        self.alone = {key: kept for key, (_, kept) in self.info.items()}
        for i in range(1, len(self.cores)):
            pair = self._core(self.units[i - 1 : i + 1])
            for t, b in self.sizes:
                both = _run(pair, ins[(i - 1, t, b)], None)[1]
                out_bytes, _ = self.info[(i, t, b)]
                self.info[(i, t, b)] = (out_bytes, max(both - self.alone[(i - 1, t, b)], 0))
        # On CUDA the kernels too: a unit's time is its kernels' where they take longer than its launches.
        self._activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.spans: Dict[tuple, List[Dict[str, float]]] = {}  # (unit, t, b) -> per round, phase -> seconds
        self.gaps: List[float] = []
        self.rests: List[float] = []

    def _core(self, units, loss=None) -> PipelineCore:
        cpu = self.device.type == "cpu"
        return PipelineCore(units, [self.device], [len(units)], [self.threads if cpu else 0], loss=loss,
                            who="calibrate")

    def round(self) -> None:
        """Times every unit at every size once (the whole model, two steps a
        size, the second timed)."""
        for t, b, x, target in self.steps:
            # A training loop runs the same sizes step after step; the step
            # after another size's finds colder caches and allocator.
            _zero_grads(self.whole)
            _run(self.whole, x, target)
            _zero_grads(self.whole)
            prof = profile(activities=self._activities)
            with _kineto_quiet():
                prof.__enter__()
            try:
                _run(self.whole, x, target)
            finally:
                with _kineto_quiet():
                    prof.__exit__(None, None, None)
            got = _unit_seconds(prof.events())
            for i in range(len(self.whole.units) + (self.loss is not None)):
                self.spans.setdefault((i, t, b), []).append({ph: got.get((i, ph), 0.0) for ph in PHASES})
        t, b, x, target = max(self.steps, key=lambda s: s[0] * s[1])
        gap, rest = _overheads(self.whole, x, target)
        self.gaps.append(gap)
        self.rests.append(rest)

    def costs(self) -> FittedCosts:
        """The fit of the rounds so far (at least one).

        Raises:
            RuntimeError: no round has run yet.
        """
        if not self.gaps:
            raise RuntimeError("Calibrator.costs: run round() at least once first")
        median = {key: {ph: statistics.median(s[ph] for s in runs) for ph in PHASES}
                  for key, runs in self.spans.items()}
        n = len(self.cores)
        measured: List[list] = [[] for _ in range(n + 1)]
        for t, b in self.sizes:
            for i in range(n):
                measured[i].append((t, b, median[(i, t, b)]) + self.info[(i, t, b)])
            if self.loss_core is not None:  # its bytes: the decoder with it, less the decoder alone
                kept = max(self.alone[(n, t, b)] - self.alone[(n - 1, t, b)], 0)
                measured[-1].append((t, b, median[(n, t, b)], 0.0, kept))
        fits = [_fit(UnitInfo(u.name, u.kind, sum(p.numel() * p.element_size() for p in u.params() if p is not None),
                              _state_bytes(u)), measured[i]) for i, u in enumerate(self.units)]
        for i, fit in enumerate(fits):  # what each unit keeps as the first of a stage: all it saves
            fit.saved_first, _ = fit_bytes([(t, b, self.alone[(i, t, b)]) for t, b in self.sizes])
        if self.loss_core is not None:
            fits.append(_fit(UnitInfo("loss", "cross_entropy", 0, 0), measured[-1]))
        return FittedCosts(str(self.device), fits, threads=self.threads, pass_gap_s=statistics.median(self.gaps),
                           step_overhead_s=max(statistics.median(self.rests), 0.0),
                           meta=dict(sizes=[list(s) for s in self.sizes], rounds=len(self.gaps),
                                     torch=torch.__version__, threads=self.threads))


def calibrate(model: nn.Sequential, *, loss_fn: Optional[nn.Module] = None, device: str = "cpu", threads: int = 1,
              sizes: Sequence[Tuple[int, int]] = DEFAULT_SIZES, repeats: int = 3, vocab_input: Optional[int] = None,
              path: Optional[str] = None) -> FittedCosts:
    """Measures each unit of ``model`` on ``device`` with the engine and fits its costs.

    Args:
        model: the ``nn.Sequential`` a pipeline would run (not modified: a
            copy is measured).
        loss_fn: the ``nn.CrossEntropyLoss`` the last stage computes, or None.
        device: where to measure, e.g. ``"cpu"`` or ``"cuda:0"``.
        threads: intra-op threads of the measured stage (a CPU stage's budget).
        sizes: the item sizes ``(t, b)`` to measure (at least 3).
        repeats: timed rounds (the median per unit and size), after an
            untimed one; each round runs every unit at every size once.
        vocab_input: for a model that starts with an Embedding, the indices
            are drawn below this (default: the Embedding's size).
        path: if given, the calibration is also saved there (JSON).

    Returns:
        :class:`~pipelstm.simulator.costs.FittedCosts` for ``predict``.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range
            (named), or a model the pipeline does not run.
    """
    _check(model, loss_fn, device, threads, sizes, repeats)
    calibrator = Calibrator(model, loss_fn=loss_fn, device=device, threads=threads, sizes=sizes,
                            vocab_input=vocab_input)
    for _ in range(repeats):
        calibrator.round()
    costs = calibrator.costs()
    if path is not None:
        costs.save(path)
    return costs


def _state_bytes(u) -> int:
    """An LSTM layer's (h, c) per sequence, in bytes."""
    if u.kind not in LSTM_KINDS:
        return 0
    return (u.out_size + u.hidden_size) * u.element_size()


def _fit(info: UnitInfo, rows) -> UnitFit:
    seconds, error = {}, {}
    for ph in PHASES:
        samples = [(t, b, spans[ph]) for t, b, spans, _, _ in rows]
        if ph == "weights" and info.param_bytes == 0 or not any(s for _, _, s in samples):
            seconds[ph] = [0.0, 0.0, 0.0]
            continue
        seconds[ph], error[ph] = fit_seconds(samples)
    saved, error["saved"] = fit_bytes([(t, b, kept) for t, b, _, _, kept in rows])
    out_per_token = statistics.median(o for _, _, _, o, _ in rows)
    table = {f"{t},{b}": dict(spans) for t, b, spans, _, _ in rows}
    if info.param_bytes == 0:
        for spans in table.values():
            spans["weights"] = 0.0
    return UnitFit(info, seconds, out_per_token, saved, error, table)


def _overheads(core: PipelineCore, x: Tensor, target: Optional[Tensor]) -> Tuple[float, float]:
    """(gap between the passes, the rest of the step outside them) of one
    training step of ``core`` (the whole model as one stage)."""
    _zero_grads(core)
    start = time.perf_counter_ns()
    out, _, _ = core.run(x, [None] * core.num_layers, [None] * core.num_layers, True, target)
    (out if target is not None else out.float().sum()).backward()
    wall = time.perf_counter_ns() - start
    ev = core.trace()
    f_end = max(e["end_ns"] for e in ev if e["phase"] == "forward")
    b_start = min(e["start_ns"] for e in ev if e["phase"] in ("backward", "recompute"))
    lo, hi = min(e["start_ns"] for e in ev), max(e["end_ns"] for e in ev)
    gap = max(b_start - f_end, 0) / 1e9
    return gap, max(wall - (hi - lo), 0) / 1e9 - gap


@contextlib.contextmanager
def _kineto_quiet():
    """The process's standard error goes nowhere meanwhile: torch's
    profiler (Kineto) writes a line there at each start and each stop
    ("USDT: ... profiler_start"), which no setting turns off, and a
    calibration starts it once per size and round (over a hundred lines
    before a job's first step)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
