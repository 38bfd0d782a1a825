"""Checkpoints of a pipelined, replicated run: per rank, plus one consolidated
state_dict of the unsplit model; written atomically, resumed exactly.

Layout of ``directory``::

    step-00000040/rank-00000.pt   this rank's stage parameters (unsplit names),
    step-00000040/rank-00001.pt   optimizer, scheduler, carried LSTM state, RNG state
    step-00000040/model.pt        the unsplit model's state_dict (loads into it;
                                  its LSTM part into nn.LSTM)
    latest                        "step-00000040": the last complete checkpoint

Every file is written to a temporary name, flushed to disk and renamed, and
``latest`` moves only after every rank has written its file, so a crash
while saving leaves the previous checkpoint intact and ``latest`` pointing
at it. A resume takes the newest checkpoint every rank can read: where a
file of the last one is missing or damaged (a disk that filled, a copy cut
short), the one before it, with a warning naming what was skipped.

A rank's file holds only what ``torch.load(weights_only=True)`` reads back
(tensors, numbers, strings, None, lists, tuples, sets and dicts of them,
dtypes and devices), checked before it is written, and it is loaded so: a
file whose pickle would build anything else (run code) is refused.
"""

import os
import pickle
import shutil
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .parallel import PipelineParallel

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "atomic_save"]

_LATEST = "latest"
# What every rank's file holds (save_checkpoint).
_STATE_KEYS = {"step", "world_size", "pp", "dp", "model", "optimizer", "scheduler", "hidden", "rng", "cuda_rng", "extra"}


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save`` to a temporary file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(directory)


def _atomic_write_text(text: str, path: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What torch.load(weights_only=True) rebuilds (torch.Size is a tuple).
_SAFE_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.Tensor, torch.dtype, torch.device)


def _check_loadable(obj: Any, where: str) -> None:
    """Raises TypeError naming the first value under ``obj`` that
    ``torch.load(weights_only=True)`` would refuse (``where``: its path)."""
    if isinstance(obj, _SAFE_LEAVES):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_loadable(k, f"{where} (a key)")
            _check_loadable(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            _check_loadable(v, f"{where}[{i}]")
        return
    raise TypeError(f"pipelstm.distributed.save_checkpoint: {where} is a {type(obj).__module__}."
                    f"{type(obj).__qualname__}, which a checkpoint cannot hold (it is loaded with "
                    "torch.load(weights_only=True)); keep to tensors, numbers, strings, None, and lists, tuples, "
                    "sets and dicts of them")


def _step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{step:08d}")


def latest_checkpoint(directory: str) -> Optional[str]:
    """The last complete checkpoint's folder, or None."""
    try:
        with open(os.path.join(directory, _LATEST)) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(directory, name)
    return path if name and os.path.isdir(path) else None


def _candidates(directory: str) -> List[str]:
    """The checkpoints to resume from, newest first: the last complete one
    (``latest``) and those before it; every step folder where ``latest`` is
    missing or names none."""
    try:
        steps = sorted((d for d in os.listdir(directory) if d.startswith("step-")), reverse=True)
    except FileNotFoundError:
        return []
    latest = latest_checkpoint(directory)
    if latest is not None:
        steps = [d for d in steps if d <= os.path.basename(latest)]
    return [os.path.join(directory, d) for d in steps if os.path.isdir(os.path.join(directory, d))]


def _last_line(e: BaseException) -> str:
    """The line of torch's weights-only refusal that says what it met."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and "documentation" not in ln]
    return lines[-1] if lines else type(e).__name__


def _read_rank_file(path: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """(the rank's state, "") or (None, why it cannot be read): missing,
    truncated or otherwise damaged.

    Raises:
        RuntimeError: the file holds objects ``torch.load(weights_only=True)``
            refuses to build (not damage: it was replaced; nothing in it runs).
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None, f"{path} is missing"
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # not a pickle of objects the safe loader refuses: bytes that are none
            return None, f"{path} cannot be read (not a checkpoint torch.load reads: {_last_line(e)})"
        raise RuntimeError(f"pipelstm.distributed.load_checkpoint: {path} holds objects that torch.load("
                           "weights_only=True) refuses to build, so it was not loaded (save_checkpoint writes "
                           f"none; was the file replaced?): {str(e).splitlines()[0]}") from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        return None, f"{path} cannot be read ({(str(e).strip().splitlines() or [type(e).__name__])[0]})"
    if not isinstance(state, dict) or not _STATE_KEYS <= state.keys():
        return None, f"{path} is not a rank's checkpoint"
    return state, ""


def save_checkpoint(directory: str, step: int, pipe: PipelineParallel, optimizer: torch.optim.Optimizer,
                    scheduler: Optional[Any] = None, extra: Optional[Dict[str, Any]] = None,
                    keep: int = 2) -> str:
    """Saves step ``step`` (a collective: every rank calls it). ``extra`` is
    state of the training loop (e.g. the epoch): tensors, numbers, strings,
    None, and lists, tuples, sets and dicts of them. The ``keep`` most recent
    checkpoints are kept. Returns the checkpoint's folder.

    Raises:
        TypeError: ``extra`` (or the optimizer's or scheduler's state) holds
            another kind of object, which ``torch.load(weights_only=True)``
            would refuse; raised on that rank before anything is written.
    """
    mesh = pipe.mesh
    state = dict(
        step=step, world_size=mesh.world_size, pp=mesh.pp, dp=mesh.dp,
        model=pipe.state_dict(), optimizer=optimizer.state_dict(),
        scheduler=scheduler.state_dict() if scheduler is not None else None,
        hidden=pipe.hidden_state(), rng=torch.get_rng_state(),
        cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        extra=extra,
    )
    _check_loadable(state, "the checkpoint")  # before the first collective: every rank stops here
    folder = _step_dir(directory, step)
    if mesh.rank == 0:
        os.makedirs(folder, exist_ok=True)
    with mesh.waiting_for("the checkpoint's start with", mesh.others(range(mesh.world_size))):
        dist.barrier()
    os.makedirs(folder, exist_ok=True)  # other machines (no shared file system)
    atomic_save(state, os.path.join(folder, f"rank-{mesh.rank:05d}.pt"))
    full = pipe.consolidated_state_dict()  # also a barrier: every rank has written its file
    if mesh.rank == 0:
        atomic_save(full, os.path.join(folder, "model.pt"))
        _atomic_write_text(os.path.basename(folder), os.path.join(directory, _LATEST))
        _prune(directory, keep)
    with mesh.waiting_for("the checkpoint's end with", mesh.others(range(mesh.world_size))):
        dist.barrier()
    return folder


def _prune(directory: str, keep: int) -> None:
    steps = sorted(d for d in os.listdir(directory) if d.startswith("step-"))
    for d in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(directory, d), ignore_errors=True)


def load_checkpoint(directory: str, pipe: PipelineParallel, optimizer: torch.optim.Optimizer,
                    scheduler: Optional[Any] = None) -> Optional[Dict[str, Any]]:
    """Restores this rank from the last complete checkpoint in ``directory``:
    stage parameters, optimizer, scheduler, carried LSTM state and RNG
    state. Returns ``{"step": ..., "extra": ..., "folder": ...}``, or None
    when there is no checkpoint (start from scratch).

    Raises:
        RuntimeError: the rank's file holds anything but tensors and plain
            data (``torch.load(weights_only=True)`` refuses it: nothing in
            it runs), or the checkpoint was written by another layout.
    """
    mesh = pipe.mesh
    folder, state = _newest_readable(directory, mesh)
    if folder is None:
        return None
    if (state["world_size"], state["pp"], state["dp"]) != (mesh.world_size, mesh.pp, mesh.dp):
        raise RuntimeError(f"pipelstm.distributed.load_checkpoint: {folder} was written by world size "
                           f"{state['world_size']} (pp={state['pp']}, dp={state['dp']}), this run has "
                           f"{mesh.world_size} (pp={mesh.pp}, dp={mesh.dp})")
    pipe.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    pipe.set_hidden_state(state["hidden"])  # the engine moves each layer's state to its device
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    steps = [None] * mesh.world_size
    with mesh.waiting_for("every rank's resumed step from", mesh.others(range(mesh.world_size))):
        dist.all_gather_object(steps, state["step"])
    if len(set(steps)) != 1:
        raise RuntimeError(f"pipelstm.distributed.load_checkpoint: the ranks resumed different steps {steps}")
    return dict(step=state["step"], extra=state["extra"], folder=folder)


def _newest_readable(directory: str, mesh) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """The newest checkpoint every rank can read, with this rank's state
    from it; (None, None) where no rank finds any. A newer one that some
    rank cannot read (a file missing, truncated or damaged) is skipped with
    a warning naming it, as a crash while saving leaves the one before
    intact. The ranks decide each candidate together (a rank on another
    machine may see other files).

    Raises:
        RuntimeError: checkpoints exist but none can be read by every rank,
            or the ranks find different checkpoints.
    """
    candidates = _candidates(directory)
    everyone: List[Any] = [None] * mesh.world_size
    names = [os.path.basename(c) for c in candidates]
    with mesh.waiting_for("every rank's checkpoint folders from", mesh.others(range(mesh.world_size))):
        dist.all_gather_object(everyone, names)
    if not any(everyone):
        return None, None
    if any(n != names for n in everyone):
        raise RuntimeError(f"pipelstm.distributed.load_checkpoint: the ranks find different checkpoints in "
                           f"{directory!r}: " + "; ".join(f"rank {r}: {n or 'none'}" for r, n in enumerate(everyone)))
    skipped = []
    for folder in candidates:
        state, why = _read_rank_file(os.path.join(folder, f"rank-{mesh.rank:05d}.pt"))
        with mesh.waiting_for("every rank's reading of a checkpoint from", mesh.others(range(mesh.world_size))):
            dist.all_gather_object(everyone, why)
        damaged = [w for w in everyone if w]
        if not damaged:
            for name, reasons in skipped:
                warnings.warn(f"pipelstm.distributed.load_checkpoint: skipped {name}, which cannot be read: "
                              f"{'; '.join(reasons)}; resuming from {os.path.basename(folder)}", stacklevel=3)
            return folder, state
        skipped.append((os.path.basename(folder), damaged))
    raise RuntimeError(f"pipelstm.distributed.load_checkpoint: no checkpoint in {directory!r} can be read by every "
                       "rank: " + " | ".join(f"{name}: {'; '.join(r)}" for name, r in skipped))
