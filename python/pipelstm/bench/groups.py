"""Process groups that stay up between timed steps, so that steps interleave.

A :class:`Group` spawns ``world`` processes joined in a gloo process group
(over a file store in a temporary folder: no port to collide on). Each
builds its workload once, ``setup(rank, world, **kwargs)``, an object with a
``step()`` method (and optionally ``info()``, figures of the last step on
that rank, e.g. busy seconds). Then, on every :meth:`Group.step`, the ranks
meet at a barrier, time one ``step()``, and the group's time is the slowest
rank's. Between steps the processes wait, blocked, on a queue, so several
groups can be up at once and take turns with each other and with work in
the calling process: the same interleaving as in-process benchmarks.

Each rank also reports its resident memory: the resident set once the
workload is built (``start_bytes``) and the largest resident set since
then, over all the steps so far (``peak_bytes``; see
:mod:`pipelstm.bench.memory`).

A benchmark's turn is :meth:`Group.turn`: ``STEPS_PER_TURN`` steps in a
row, the last one timed.
"""

import datetime
import gc
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .memory import available_bytes, peak_bytes, reset_peak, rss_bytes
from .timing import interleaved_times

__all__ = ["Group", "close_all", "take_turns", "MIN_AVAILABLE_BYTES", "STEPS_PER_TURN"]

# Steps of a turn (Group.turn), the last one timed. Timing the first step
# of each turn, with ten processes of `bench lm` taking turns, nn.LSTM with
# 2 threads at H=512 B=32 took a median of 1.49-1.67 s against 1.36 s
# alone, while pipelstm.LSTM's and the pipelines' steps stayed within a few
# percent of their times alone; timing the second, 1.35 s (a /tmp script,
# medians of 7; commit 388cbb7).
STEPS_PER_TURN = 2

# Before each step, at least this much memory must be free on the machine:
# with many groups up at once, stop with a message rather than swap or be killed.
MIN_AVAILABLE_BYTES = 2 << 30


def _worker(rank: int, world: int, init_file: str, setup: Callable, kwargs: dict, commands, results,
            timeout: float) -> None:
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)  # setup may ask for more
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        workload = setup(rank, world, **kwargs)
        gc.collect()
        start = rss_bytes()
        reset_peak()
        results.put(("ready", rank, None))
        while commands.get() == "step":
            dist.barrier()
            t0 = time.perf_counter()
            workload.step()
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            info = dict(getattr(workload, "info", dict)())
            info.update(start_bytes=start, peak_bytes=peak_bytes())
            results.put(("step", rank, (elapsed.item(), info)))
    except BaseException:  # noqa: BLE001  (reported to the parent, which raises it)
        results.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Group:
    """``world`` worker processes running ``setup(rank, world, **kwargs)``'s workload.

    Args:
        name: for messages.
        world: processes (ranks).
        setup: a module-level function (spawned processes import it by name).
        timeout: seconds any one wait (start-up, one step) may take.

    Starting does not wait for the processes; :meth:`wait_ready` does, so
    that several groups start at once. Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, name: str, world: int, setup: Callable, *, timeout: float = 1800.0, **kwargs) -> None:
        self.name, self.world, self.timeout = name, world, timeout
        self.last: List[Dict[str, object]] = []  # per rank, after each step: info + memory
        ctx = mp.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="pipelstm_bench_group")
        self._results = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(world)]
        self._procs = [
            ctx.Process(target=_worker, daemon=True, name=f"{name} rank {r}",
                        args=(r, world, os.path.join(self._dir, "store"), setup, kwargs, self._commands[r],
                              self._results, timeout))
            for r in range(world)
        ]
        for p in self._procs:
            p.start()
        self._ready = False

    def wait_ready(self) -> None:
        if not self._ready:
            self._receive("ready")
            self._ready = True

    def turn(self, steps: int = STEPS_PER_TURN) -> float:
        """``steps`` steps in a row, the last one's seconds (and ``self.last``):
        the step of a training loop, which follows the same workload's step
        rather than another process's."""
        for _ in range(steps - 1):
            self.step()
        return self.step()

    def step(self) -> float:
        """Seconds of one step, the slowest rank's; per-rank figures in ``self.last``."""
        self.wait_ready()
        free = available_bytes()
        if free is not None and free < MIN_AVAILABLE_BYTES:
            raise MemoryError(f"{self.name}: only {free / 2**30:.1f} GiB of memory left with every group up; "
                              "measure fewer configurations in one run")
        for q in self._commands:
            q.put("step")
        replies = self._receive("step")
        self.last = [info for _, info in replies]
        return max(seconds for seconds, _ in replies)

    def _receive(self, kind: str) -> list:
        got: Dict[int, object] = {}
        deadline = time.monotonic() + self.timeout
        while len(got) < self.world:
            try:
                what, rank, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{self.name}: rank {dead[0][0]} died (exit code {dead[0][1]})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name}: no {kind} reply within {self.timeout:.0f} s") from None
                continue
            if what == "error":
                raise RuntimeError(f"{self.name}, rank {rank} failed:\n{payload}")
            got[rank] = payload
        return [got[r] for r in range(self.world)]

    def close(self) -> None:
        for q, p in zip(self._commands, self._procs):
            if p.is_alive():
                q.put("stop")
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Group({self.name!r}, world={self.world})"


def close_all(groups: List[Optional[Group]]) -> None:
    """Closes every group (for a ``finally:``)."""
    for g in groups:
        if g is not None:
            g.close()


def take_turns(groups: List[Group], reps: int) -> Tuple[Dict[str, List[float]], List[List[List[dict]]]]:
    """``reps`` turns of every group, interleaved after a warm-up turn each
    (:func:`pipelstm.bench.timing.interleaved_times` over :meth:`Group.turn`):
    the seconds of each turn's timed step, keyed by the group's index as a
    string, and every rank's figures of those steps (``Group.last``; the
    warm-up turn's first)."""
    for g in groups:
        g.wait_ready()
    infos: List[List[List[dict]]] = [[] for _ in groups]

    def turn_of(i: int) -> Callable[[], float]:
        def turn() -> float:
            seconds = groups[i].turn()
            infos[i].append(groups[i].last)
            return seconds
        return turn

    times = interleaved_times({str(i): turn_of(i) for i in range(len(groups))}, reps)
    return times, infos
