"""Running examples/train_lm.py under torchrun from the tests, and the
single-process reference it is compared with."""

import contextlib
import datetime
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.distributed as dist

# The distributed tests' mark: they need torch.distributed and its gloo backend.
needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

ROOT = Path(__file__).resolve().parents[1]
TRAIN_LM = ROOT / "examples" / "train_lm.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# A small model and batch: 5 steps take a few seconds per process.
SMALL = ["--emb", "16", "--hidden", "32", "--layers", "2", "--batch-size", "8", "--bptt", "12", "--chunks", "3",
         "--micro-batches", "2", "--dropout", "0", "--optimizer", "sgd", "--lr", "1.0", "--clip", "0.05",
         "--threads", "1", "--log-interval", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(tag: Optional[str] = None) -> Dict[str, str]:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONUNBUFFERED"] = "1"
    e.pop("RANK", None)
    if tag:
        e["PIPELSTM_TEST_TAG"] = tag
    return e


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(tag: str) -> Dict[int, Optional[int]]:
    """The live processes started with PIPELSTM_TEST_TAG=tag: pid -> global
    rank for a torchrun worker (its $RANK), None for an agent. A process that
    has exited (a zombie included) is not listed."""
    needle = f"PIPELSTM_TEST_TAG={tag}".encode()
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if needle in environ:
            rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
            found[int(pid)] = rank
    return found


def parent_of(pid: int) -> Optional[int]:
    """The parent pid of a live process, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def kill_tagged(tag: str) -> None:
    """SIGKILLs every process started with PIPELSTM_TEST_TAG=tag: a stopped
    worker outlives its torchrun agent, whatever session it is in."""
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launch(cmd: List[str], tag: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(tag),
                            cwd=ROOT, start_new_session=True)


@dataclass
class Run:
    """What ``watch_run`` saw of a torchrun run (times: time.monotonic())."""

    lines: List[Tuple[float, int, str]]  # (time read, agent index, line)
    returncodes: List[Optional[int]]  # per agent; None: still running when the watch ended
    workers: Dict[int, int]  # pid -> global rank, every worker seen
    gone: Dict[int, float]  # pid -> when it was no longer running, for every process of the run seen to end
    end: Optional[float]  # when the last process of the run (agents and workers) had ended; None: some had not

    def text(self) -> str:
        return "".join(line for _, _, line in self.lines)

    def first(self, pattern: str) -> Optional[Tuple[float, str]]:
        """(time, line) of the first line matching the regular expression."""
        return next(((t, line) for t, _, line in self.lines if re.search(pattern, line)), None)

    def exit_codes(self) -> Dict[int, int]:
        """pid -> exit code of the workers whose agent reported one (its
        "failed (exitcode: N) local_rank: R (pid: P)" line and its summary of
        failures; a negative code is the signal that ended the worker)."""
        text = self.text()
        codes = {}
        for pattern in (r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)",
                        r"exitcode\s*: (-?\d+) \(pid: (\d+)\)"):
            for code, pid in re.findall(pattern, text):
                codes[int(pid)] = int(code)
        return codes


def watch_run(procs: List[subprocess.Popen], tag: str, after: str, within: float, limit: float = 150) -> Run:
    """Reads the agents' output and watches every process of the run (the
    agents and their workers, found by ``tag``) until all have ended, or
    ``within`` seconds after the first line containing ``after``, or after
    ``limit`` seconds in all. Output is read by threads: a pipe stays open
    while any child holding it lives (a stopped worker)."""
    lines: "queue.Queue" = queue.Queue()

    def read(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            lines.put((time.monotonic(), i, line))

    for i, proc in enumerate(procs):
        threading.Thread(target=read, args=(i, proc), daemon=True).start()
    start = time.monotonic()
    seen: List[Tuple[float, int, str]] = []
    workers: Dict[int, int] = {}
    gone: Dict[int, float] = {}
    live: Dict[int, Optional[int]] = {}
    t_after, end = None, None
    while True:
        now = time.monotonic()
        while not lines.empty():
            seen.append(lines.get())
            if t_after is None and after in seen[-1][2]:
                t_after = seen[-1][0]
        now_live = tagged(tag)
        # A worker is a ranked child of an agent; a process a worker starts
        # (torch may run helpers) inherits RANK but is not one.
        workers.update({pid: rank for pid, rank in now_live.items()
                        if rank is not None and pid not in workers and now_live.get(parent_of(pid), 0) is None})
        for pid in live:
            if pid not in now_live:
                gone.setdefault(pid, now)
        live.update(now_live)
        live = {pid: rank for pid, rank in live.items() if pid not in gone}
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                gone.setdefault(-1 - i, now)  # the agents, by index
        if not live and all(proc.poll() is not None for proc in procs):
            end = max(gone.values())
            break
        if now - start > limit or (t_after is not None and now - t_after > within):
            break
        time.sleep(0.05)
    time.sleep(0.5)  # the last lines
    while not lines.empty():
        seen.append(lines.get())
    return Run(seen, [proc.poll() for proc in procs], workers, gone, end)


def torchrun(nproc: int, args: List[str], *, extra: Optional[List[str]] = None, timeout: float = 300,
             script: Path = TRAIN_LM):
    """One agent, ``nproc`` processes on this machine, each running ``script``
    (train_lm.py by default); returns the CompletedProcess."""
    cmd = TORCHRUN + ["--standalone", f"--nproc-per-node={nproc}", "--monitor-interval=0.2"] + (extra or [])
    cmd += [str(script)] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


def listening(port: int) -> bool:
    """Whether a TCP socket on this machine listens on ``port`` (read from
    /proc/net, without connecting to it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return True
    return False


def two_agents(args: List[str], *, tag: Optional[str] = None,
               options: Optional[List[str]] = None) -> List[subprocess.Popen]:
    """Two torchrun agents (two "machines"), one process each, c10d rendezvous
    on 127.0.0.1. The second starts once the first hosts the rendezvous store
    (both could: whichever binds the port first does); the rendezvous orders
    the agents by process id, so the first agent's worker is rank 0.
    ``options``: torchrun options (default ``--monitor-interval=0.2``)."""
    port = free_port()
    procs = []
    for node in range(2):
        cmd = TORCHRUN + ["--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}", "--rdzv-backend=c10d",
                          f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=pipelstm-test-{port}",
                          *(options or ["--monitor-interval=0.2"]), str(TRAIN_LM)] + args
        procs.append(launch(cmd, tag or new_tag()))
        deadline = time.monotonic() + 120
        while node == 0 and not listening(port):
            assert procs[0].poll() is None and time.monotonic() < deadline, "the first agent hosts no store"
            time.sleep(0.05)
    return procs


def reference_parameters(steps: int, argv: List[str]) -> Dict[str, torch.Tensor]:
    """The same training, in this process, on the full batch, with nothing of
    pipelstm's: torch's nn.LSTM (weights copied), torch.nn.utils.clip_grad_norm_."""
    sys.path.insert(0, str(TRAIN_LM.parent))
    try:
        import train_lm
    finally:
        sys.path.pop(0)
    args = train_lm.parse_args(argv)
    torch.set_num_threads(1)
    corpus = train_lm.Corpus(args.data)
    train = train_lm.batchify(corpus.train, args.batch_size)
    model = train_lm.build_model(len(corpus.vocab), args.emb, args.hidden, args.layers, args.dropout, args.seed)
    emb, lstm, drop, dec = model
    ref_lstm = torch.nn.LSTM(args.emb, args.hidden, args.layers, dropout=args.dropout)
    ref_lstm.load_state_dict(lstm.state_dict())
    ref = torch.nn.Sequential(emb, ref_lstm, drop, dec)
    assert args.optimizer == "sgd"
    opt = torch.optim.SGD(ref.parameters(), lr=args.lr)
    hidden = None
    for i in range(steps):
        x, y = train_lm.get_batch(train, i, args.bptt)
        out, hidden = ref_lstm(emb(x), hidden)
        hidden = tuple(h.detach() for h in hidden)
        logits = dec(drop(out))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), args.clip)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in ref.state_dict().items()}


def max_difference(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@contextlib.contextmanager
def one_process_mesh(folder: Path, **init_mesh_kwargs):
    """A gloo process group of one (this process, a file store in ``folder``)
    and its ``init_mesh(**init_mesh_kwargs)``; destroyed on exit."""
    from pipelstm.distributed import init_mesh

    store = dist.FileStore(str(folder / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        yield init_mesh(**init_mesh_kwargs)
    finally:
        dist.destroy_process_group()
