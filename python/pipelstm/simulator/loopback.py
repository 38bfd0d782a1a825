"""What a machine's processes cost each other, measured over gloo:
``ping_pong`` (a point-to-point link), ``allreduce_times`` (the collective),
``gradient_handling_times`` (what DDP's reducer adds to a step) and
``compute_sharing`` (how much a computing process slows down while
others compute beside it, and while they keep in lock step), each over a process group
(``pipelstm.distributed``'s automatic layout runs them in the job), or all
three in two processes ``pair_times`` spawns on this machine
(``clusters.local_machine``); and ``fit_link``, ``latency + bytes /
bandwidth`` from the times."""

import socket
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["ping_pong", "allreduce_times", "gradient_handling_times", "compute_sharing", "pair_times", "fit_link"]


def ping_pong(rank: int, sizes: Sequence[int], repeats: int, peer: Optional[int] = None) -> List[float]:
    """Seconds of a one-way transfer of each of ``sizes`` bytes between
    global ranks 0 and 1 (``rank``: this one's; ``peer``: the other's,
    default the other of 0 and 1): half the fastest of ``repeats`` round
    trips, after one that warms the connection up."""
    import torch
    import torch.distributed as dist

    peer = 1 - rank if peer is None else peer
    out = []
    for n in sizes:
        buf = torch.zeros(max(n // 4, 1), dtype=torch.float32)
        samples = []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            samples.append(time.perf_counter() - t)
        out.append(min(samples[1:]) / 2)  # the link's capability: the fastest round trip
    return out


def allreduce_times(sizes: Sequence[int], repeats: int) -> List[float]:
    """Seconds of a gloo all-reduce of each of ``sizes`` bytes over the
    default process group (the median of ``repeats``, after three that warm
    it up). A collective: every rank calls it."""
    import torch
    import torch.distributed as dist

    out = []
    for n in sizes:
        buf = torch.ones(max(n // 4, 1), dtype=torch.float32)
        samples = []
        for _ in range(repeats + 3):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(buf)
            samples.append(time.perf_counter() - t)
        out.append(statistics.median(samples[3:]))
    return out


def _no_communication(state, bucket):
    """A DDP communication hook that does what the default one does to the
    bucket (divides it by the world size) but communicates nothing."""
    import torch
    import torch.distributed as dist

    future = torch.futures.Future()
    future.set_result(bucket.buffer().div_(dist.get_world_size()))
    return future


def gradient_handling_times(sizes: Sequence[int], repeats: int) -> List[float]:
    """Seconds DDP's reducer adds to a step for each of ``sizes`` bytes of
    float32 gradients, besides the all-reduce: the median over ``repeats``
    rounds (after two) of a backward that only writes the gradients, under
    DDP with a hook that divides the bucket as DDP's own does but
    communicates nothing, less the same backward without DDP. A collective
    over the default group: every rank calls it.
    """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    def gradients(nbytes: int) -> nn.Module:
        n, piece = max(nbytes // 4, 1), 1 << 18  # tensors of at most 1 MiB, as a model's are many
        module = nn.Module()
        module.weights = nn.ParameterList([nn.Parameter(torch.zeros(min(piece, n - i))) for i in range(0, n, piece)])
        module.forward = lambda x: sum(w.sum() for w in module.weights) * x
        return module

    x = torch.ones(())
    out = []
    for n in sizes:
        plain = gradients(n)
        wrapped = DistributedDataParallel(gradients(n))
        wrapped.register_comm_hook(None, _no_communication)
        extra = []
        for _ in range(repeats + 2):
            seconds = []
            for m in (plain, wrapped):
                m.zero_grad(set_to_none=True)
                dist.barrier()
                t = time.perf_counter()
                m(x).backward()
                seconds.append(time.perf_counter() - t)
            extra.append(seconds[1] - seconds[0])
        out.append(max(statistics.median(extra[2:]), 0.0))
    return out


def _lstm_step():
    """A one-thread LSTM layer's forward and backward, the kind of work the
    stages do (small enough to take a few milliseconds)."""
    import torch

    from ..lstm import LSTM

    torch.manual_seed(0)
    lstm = LSTM(256, 256)
    x = torch.randn(32, 8, 256)

    def step():
        out, _ = lstm(x)
        out.sum().backward()

    return step


def compute_sharing(rank: int, together: Sequence[int], repeats: int = 7,
                    step: Optional[Callable[[], None]] = None) -> Tuple[float, float]:
    """How much longer rank 0's compute takes while the ``together`` ranks
    (rank 0 among them, processes of one machine) compute at once than
    alone, and how much longer again when they keep in lock step, as
    data-parallel replicas do (each step waits for the slowest).

    Each of ``repeats`` rounds times three one-thread runs of ``step``
    alone, three side by side, and three in lock step (a barrier after
    each); the sharing is the median over the rounds of side by side over
    alone, the wait of lock step over side by side, each at least 1.0.
    ``step`` defaults to a small LSTM layer's forward and backward; the
    model's own (``calibrate.model_step``) says more, as the sharing
    depends on how much of the caches the work needs. A collective over
    the default group: every rank calls it; the others get (1.0, 1.0).

    Returns:
        ``(compute_sharing, replica_wait)`` (``Cluster``'s fields).
    """
    import torch
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = step or _lstm_step()
        step()  # warm up: weights packed, buffers allocated

        def timed(n: int, run: bool, lock_step: bool) -> float:
            samples = []
            for _ in range(n):
                t = time.perf_counter()
                if run:
                    step()
                if lock_step:
                    dist.barrier()
                samples.append(time.perf_counter() - t)
            return statistics.median(samples)

        # Rounds of alone, side by side and in lock step, so that what else
        # the machine does falls on all three alike; medians of the ratios.
        sharing, wait = [], []
        for _ in range(repeats):
            dist.barrier()
            alone = timed(3, rank == 0, False) if rank == 0 else 0.0
            dist.barrier()
            beside = timed(3, True, False) if rank in together else 0.0
            dist.barrier()
            locked = timed(3, rank in together, True)
            if rank == 0:
                sharing.append(beside / alone)
                wait.append(locked / beside)
        dist.barrier()
    finally:
        torch.set_num_threads(threads)
    if rank != 0:
        return 1.0, 1.0
    return max(1.0, statistics.median(sharing)), max(1.0, statistics.median(wait))


def fit_link(sizes: Sequence[int], times: Sequence[float], who: str, clamp: bool = False):
    """``Link(latency, bandwidth)`` from one-way ``times`` of ``sizes``
    bytes: the bandwidth by least squares, the latency from the smallest
    size (the intercept of a fit over sizes far apart is mostly noise from
    the largest ones). With ``clamp``, a fit too noisy to give a bandwidth
    takes 10 TB/s (a job must go on planning) instead of raising.

    Raises:
        RuntimeError: larger messages were not slower (too noisy to fit;
            the message starts with ``who``).
    """
    from .model import Link

    n = len(sizes)
    mx, my = sum(sizes) / n, sum(times) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, times)) / sum((x - mx) ** 2 for x in sizes)
    if clamp:
        slope = max(slope, 1e-13)
    if slope <= 0:
        raise RuntimeError(f"{who}: larger messages were not slower ({dict(zip(sizes, times))}); the machine is "
                           "too busy to measure the link, pass the link instead")
    small = min(range(n), key=lambda i: sizes[i])
    return Link(latency_s=max(times[small] - sizes[small] * slope, 0.0), bytes_per_s=1.0 / slope)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, sizes: List[int], repeats: int, queue, workload, link_only: bool) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out = dict(one_way=ping_pong(rank, sizes, repeats))
        if not link_only:
            step = workload() if workload is not None else None
            out["allreduce"] = allreduce_times(sizes, repeats)
            out["gradients"] = gradient_handling_times(sizes, repeats)
            out["sharing"], out["wait"] = compute_sharing(rank, [0, 1], repeats, step)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def pair_times(sizes: List[int], repeats: int, timeout: float = 120.0,
               workload: Optional[Callable[[], Callable[[], None]]] = None,
               link_only: bool = False) -> Dict[str, object]:
    """Between two CPU processes it spawns on this machine, over gloo: the
    seconds of a one-way transfer of each of ``sizes`` bytes (half the
    fastest of ``repeats`` round trips), of an all-reduce of each
    (medians), and their compute sharing (:func:`compute_sharing` of the
    step ``workload()`` makes in each process, a picklable function such
    as ``functools.partial(calibrate.model_step, model, loss_fn, (t, b))``,
    and their wait in lock step), and what DDP's reducer adds for each
    size of gradients (:func:`gradient_handling_times`), as ``{"one_way":
    [...], "allreduce": [...], "gradients": [...], "sharing": float, "wait":
    float}``; with ``link_only``, the one-way times alone.

    Raises:
        RuntimeError: a process failed or did not answer within ``timeout``.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, sizes, repeats, queue, workload, link_only))
             for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        while True:  # until the result, a process that died, or the deadline
            try:
                result = queue.get(timeout=0.5)
                break
            except Exception as e:  # queue.Empty
                failed = any(p.exitcode not in (None, 0) for p in procs)
                if failed or time.monotonic() > deadline:
                    why = "a process failed" if failed else f"no result within {timeout:g} s"
                    raise RuntimeError(f"measure_loopback: the two gloo processes gave no result: {why} "
                                       f"(exit codes {[p.exitcode for p in procs]})") from e
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return result
