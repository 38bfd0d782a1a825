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
at it.

A rank's file holds only what ``torch.load(weights_only=True)`` reads back
(tensors, numbers, strings, None, lists, tuples, sets and dicts of them,
dtypes and devices), checked before it is written, and it is loaded so: a
file whose pickle would build anything else (run code) is refused.
"""

import os
import pickle
import shutil
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from .parallel import PipelineParallel

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "atomic_save"]

_LATEST = "latest"


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
    return path if os.path.isdir(path) else None


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
    folder = latest_checkpoint(directory)
    # Every rank must agree (a rank on another machine may not see the folder).
    found = [folder is not None]
    everyone = [None] * mesh.world_size
    with mesh.waiting_for("every rank's checkpoint folder from", mesh.others(range(mesh.world_size))):
        dist.all_gather_object(everyone, found[0])
    if not any(everyone):
        return None
    if not all(everyone):
        missing = [r for r, f in enumerate(everyone) if not f]
        raise RuntimeError(f"pipelstm.distributed.load_checkpoint: ranks {missing} find no checkpoint in "
                           f"{directory!r}; the others do")
    path = os.path.join(folder, f"rank-{mesh.rank:05d}.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise RuntimeError(f"pipelstm.distributed.load_checkpoint: {path} holds objects that torch.load("
                           "weights_only=True) refuses to build, so it was not loaded (save_checkpoint writes "
                           f"none; was the file replaced?): {str(e).splitlines()[0]}") from e
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
