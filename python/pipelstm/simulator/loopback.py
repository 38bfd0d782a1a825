"""A gloo ping-pong between two CPU processes of this machine: the link
between local ranks, as ``clusters.measure_loopback`` fits it."""

import socket
import time
from typing import List

__all__ = ["round_trips"]


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
        out = []
        for n in sizes:
            buf = torch.zeros(max(n // 4, 1), dtype=torch.float32)
            samples = []
            for _ in range(repeats + 1):  # the first warms the connection up
                t = time.perf_counter()
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                samples.append(time.perf_counter() - t)
            out.append(min(samples[1:]) / 2)  # the link's capability: the fastest round trip
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
