"""Running examples/train_lm.py under torchrun from the tests, and the
single-process reference it is compared with."""

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

import torch

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


def kill_tagged(tag: str) -> None:
    """SIGKILLs every process started with PIPELSTM_TEST_TAG=tag: a stopped
    worker outlives its torchrun agent, whatever session it is in."""
    needle = f"PIPELSTM_TEST_TAG={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def launch(cmd: List[str], tag: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(tag),
                            cwd=ROOT, start_new_session=True)


def watch(proc: subprocess.Popen, deadline: float):
    """Reads the process's output until it exits or ``deadline`` seconds
    pass (a reader thread: the pipe stays open while any child holding it
    lives, e.g. a stopped worker). Returns ([(time read, line)], returncode
    or None)."""
    lines: "queue.Queue" = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put((time.monotonic(), line))

    threading.Thread(target=read, daemon=True).start()
    end = time.monotonic() + deadline
    rc = None
    while time.monotonic() < end:
        rc = proc.poll()
        if rc is not None:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # the last lines
    out = []
    while not lines.empty():
        out.append(lines.get())
    return out, rc


def torchrun(nproc: int, args: List[str], *, extra: Optional[List[str]] = None, timeout: float = 300):
    """One agent, ``nproc`` processes on this machine; returns the CompletedProcess."""
    cmd = TORCHRUN + ["--standalone", f"--nproc-per-node={nproc}", "--monitor-interval=0.2"] + (extra or [])
    cmd += [str(TRAIN_LM)] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


def two_agents(args: List[str], *, tag: Optional[str] = None) -> List[subprocess.Popen]:
    """Two torchrun agents (two "machines"), one process each, c10d rendezvous on 127.0.0.1."""
    port = free_port()
    procs = []
    for node in range(2):
        cmd = TORCHRUN + ["--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}", "--rdzv-backend=c10d",
                          f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=pipelstm-test-{port}",
                          "--monitor-interval=0.2", str(TRAIN_LM)] + args
        procs.append(launch(cmd, tag or new_tag()))
        time.sleep(0.5)  # the first agent hosts the rendezvous store
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
