"""The workloads of ``python -m pipelstm.bench simulator``, each run by a
:class:`pipelstm.bench.groups.Group` in processes of its own: the
calibration in rounds, the gloo probe, PipelineParallel's step, and the
memory of a step.
"""

import ctypes
import gc
import statistics
import time
from typing import List

import torch
import torch.distributed as dist
from torch import nn

from .. import simulator as sim
from .memory import peak_bytes, reset_peak, rss_bytes
from .pipeline import build, setup_pipeline, stage_busy
from .pipelining_peer import SIZES, make_data

__all__ = ["setup_parallel", "setup_memory", "setup_link_probe", "setup_calibration", "gloo_links",
           "MEMORY_ENV"]

# The memory runs: no buffer cache, every allocation of 64 KiB and more mapped on its own.
MEMORY_ENV = dict(PIPELSTM_BUFFER_CACHE_MB="0", MALLOC_MMAP_THRESHOLD_="65536")


class _ParallelStep:
    """This rank's stage of ``PipelineParallel`` (pp x dp over the Group's gloo
    ranks) and one training step of its share of the global batch."""

    def __init__(self, pp: int, chunks: int, micro_batches: int) -> None:
        from .. import distributed as pdist

        mesh = pdist.init_mesh(pp=pp, timeout=600.0)
        s = SIZES[True]
        torch.manual_seed(0)
        model = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
        self.pipe = pdist.PipelineParallel(model, mesh, chunks=chunks, micro_batches=micro_batches,
                                           carry_state=False, threads=1, loss_fn=nn.CrossEntropyLoss())
        x, target = make_data(s["vocab"], s["T"], s["B"], 0)
        share = s["B"] // mesh.dp
        rows = slice(mesh.dp_rank * share, (mesh.dp_rank + 1) * share)
        self.x, self.target = x[:, rows].contiguous(), target.t()[:, rows].contiguous()
        self.balance = list(self.pipe.balance)

    def zero_grad(self) -> None:
        self.pipe.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.zero_grad()
        self.pipe.train_step(self.x, self.target)

    def info(self) -> dict:
        core = self.pipe.core
        return dict(busy=stage_busy(core.trace(), self.pipe.num_local_stages), kept=core.saved_activation_bytes,
                    balance=self.balance)


def setup_parallel(rank: int, world: int, pp: int, chunks: int, micro_batches: int) -> _ParallelStep:
    """A :class:`pipelstm.bench.groups.Group` workload: PipelineParallel, pp x (world / pp)."""
    return _ParallelStep(pp, chunks, micro_batches)


class _Memory:
    """Another workload's step, measuring the rise of the resident set's peak over the step."""

    def __init__(self, inner) -> None:
        self.inner, self.rise = inner, 0

    def step(self) -> None:
        self.inner.pipe.zero_grad(set_to_none=True)
        gc.collect()
        _trim()
        before = rss_bytes()
        reset_peak()
        self.inner.step()
        self.rise = peak_bytes() - before

    def info(self) -> dict:
        return dict(rise=self.rise)


def _trim() -> None:
    """Gives glibc's free heap memory back to the system (malloc_trim), so
    that what the step before freed is not counted as resident before this one."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def setup_memory(rank: int, world: int, kind: str, **kwargs) -> _Memory:
    """A Group workload: the step of ``kind`` ("pipeline" or "parallel") with its memory rise."""
    return _Memory(setup_pipeline(rank, world, quick=True, loss_outside=False, **kwargs) if kind == "pipeline"
                   else setup_parallel(rank, world, **kwargs))


class _LinkProbe:
    """Between ranks 0 and 1 (gloo): the one-way seconds of a ping-pong,
    and the seconds of an all-reduce, of each size."""

    SIZES = (8, 1 << 16, 1 << 20, 1 << 22, 9 << 20)

    def __init__(self) -> None:
        self.rank, self.times, self.allreduce = dist.get_rank(), {}, {}

    def step(self) -> None:
        for n in self.SIZES:
            buf = torch.zeros(max(n // 4, 1))
            laps, reduces = [], []
            for _ in range(5):
                dist.barrier()
                t0 = time.perf_counter()
                if self.rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                laps.append((time.perf_counter() - t0) / 2)
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                reduces.append(time.perf_counter() - t0)
            self.times[n], self.allreduce[n] = statistics.median(laps), statistics.median(reduces)

    def info(self) -> dict:
        return dict(times=self.times, allreduce=self.allreduce)


def setup_link_probe(rank: int, world: int) -> _LinkProbe:
    """A Group workload: the gloo ping-pong of :class:`_LinkProbe`."""
    return _LinkProbe()


def gloo_links(turns: List[List[dict]]) -> tuple:
    """(the point-to-point link, the all-reduce) from the probe's turns,
    rank 0's medians: the smallest time is the latency; the slope to the
    largest message, the seconds per byte (unbounded bytes per second where
    it does not grow)."""
    def fit(key):
        sizes = turns[0][0][key].keys()
        times = {int(n): statistics.median(t[0][key][n] for t in turns) for n in sizes}
        fixed, large = min(times.values()), max(times)
        per_byte = max((times[large] - fixed) / large, 0.0)
        return sim.Link(latency_s=fixed, bytes_per_s=1 / per_byte if per_byte > 0 else float("inf"))

    return fit("times"), fit("allreduce")


class _Calibration:
    """The calibration in a process of its own, one round a step (taking
    turns with the configurations, so it sees the machine they see)."""

    def __init__(self, sizes) -> None:
        s = SIZES[True]
        torch.manual_seed(0)
        self.calibrator = sim.Calibrator(build(s["vocab"], s["emb"], s["hidden"], s["layers"]),
                                               loss_fn=nn.CrossEntropyLoss(), threads=1, sizes=sizes)

    def step(self) -> None:
        self.calibrator.round()

    def info(self) -> dict:
        return dict(costs=self.calibrator.costs().to_dict())


def setup_calibration(rank: int, world: int, sizes) -> _Calibration:
    """A Group workload: rounds of ``pipelstm.simulator.Calibrator`` on the bench's model."""
    return _Calibration(sizes)
