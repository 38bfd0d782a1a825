"""The engine of a pipeline: its stage specs, one differentiable run, and the
modules that hold one."""

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _C
from .placement import cap_threads
from .units import Unit

__all__ = ["CHECKPOINT_MODES", "check_checkpoint", "check_positive_ints", "stage_specs", "run_engine",
           "EngineHolder"]

_engine = _C.pipeline
CHECKPOINT_MODES = ("never", "except_last", "always")


def check_checkpoint(who: str, checkpoint: str) -> str:
    if checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"{who}: checkpoint must be one of {', '.join(map(repr, CHECKPOINT_MODES))}, "
                         f"got {checkpoint!r}")
    return checkpoint


def check_positive_ints(who: str, **values) -> None:
    for what, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{who}: {what} must be a positive int, got {v!r}")


def stage_specs(units: Sequence[Unit], balance: Sequence[int], devices: Sequence[torch.device],
                threads: Sequence[int], loss: Optional[dict] = None) -> list:
    """The engine's description of the stages. LSTM layers are numbered in
    order from 0 (their slot among the initial and final states). A ``loss``
    (``ignore_index``, ``mean``) ends the last stage."""
    specs, i, layer = [], 0, 0
    for s, count in enumerate(balance):
        stage_units = []
        for u in units[i : i + count]:
            stage_units.append(u.spec(layer))
            layer += u.kind == "lstm"
        if loss is not None and s == len(balance) - 1:
            stage_units.append(_engine.UnitSpec(_engine.UnitKind.cross_entropy, "loss", **loss))
        specs.append(_engine.StageSpec(str(devices[s]), stage_units, int(threads[s])))
        i += count
    return specs


class _PipelineFunction(torch.autograd.Function):
    """The whole pipelined forward as one autograd node; its backward is the
    engine's pipelined backward, returning the gradients of the input, the
    initial states and every parameter (each on its own stage's device)."""

    @staticmethod
    def forward(ctx, pipe, layout, target: Optional[Tensor], input: Tensor, *tensors: Optional[Tensor]):
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


def run_engine(owner, units: Sequence[Unit], x: Tensor, h0: List[Optional[Tensor]],
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
            self.threads = cap_threads(self.threads, devices)
        self._build_engine()
