"""A gloo ping-pong between two processes and the link it measures:
``ping_pong`` over a process group (``pipelstm.distributed``'s
``measure_link`` runs it in the job), ``round_trips`` in two processes it
spawns on this machine (``clusters.measure_loopback``), and ``fit_link``,
``latency + bytes / bandwidth`` from the times."""

import socket
import time
from typing import List, Optional, Sequence

__all__ = ["ping_pong", "round_trips", "fit_link"]


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


def _worker(rank: int, port: int, sizes: List[int], repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out = ping_pong(rank, sizes, repeats)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def round_trips(sizes: List[int], repeats: int, timeout: float = 60.0) -> List[float]:
    """Seconds of a one-way gloo transfer of each of ``sizes`` bytes between
    two spawned CPU processes (half the fastest of ``repeats`` round trips).

    Raises:
        RuntimeError: a process failed or did not answer within ``timeout``.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, sizes, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        result = queue.get(timeout=timeout)
    except Exception as e:  # queue.Empty: a worker died or hung
        raise RuntimeError(f"measure_loopback: the gloo ping-pong gave no result within {timeout:g} s "
                           f"(exit codes {[p.exitcode for p in procs]})") from e
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return result
