"""python -m pipelstm.bench pipelining: PyTorch's own ``torch.distributed.pipelining`` as a peer.

The model of the pipeline benchmark, built only from PyTorch modules,

    nn.Embedding(vocab, emb) -> nn.LSTM(emb, hidden, num_layers=4) -> nn.Linear(hidden, vocab)

(full: vocab 10k, emb 512, H=1024, T=256, B=32; ``--quick``: vocab 1k, emb 128,
H=256, T=64, B=16; time-major input [T, B] int64), one training step (forward +
backward, loss = cross-entropy of the decoder output against random targets,
mean over the tokens), split into 2 stages that run in 2 processes (gloo
backend on the CPU, 1 intra-op thread each) under ``ScheduleGPipe`` or
``Schedule1F1B``:

* stage 0 = embedding + the first k LSTM layers, stage 1 = the remaining LSTM
  layers + decoder (+ the loss); k balances the forward FLOPs per token (LSTM
  layer 8*H*(I+H), decoder 2*H*vocab), see :func:`balanced_split`: k = 3 at
  full size (46.1 : 37.3 MFLOP/token), k = 2 at the quick size (1.84 : 2.61).
* the stages are built by hand (``PipelineStage(submodule, stage_index,
  num_stages, device, input_args=..., output_args=...)``, static shapes, no
  tracing); micro-batches split the batch dimension, dim 1 of the time-major
  input (``args_chunk_spec=(TensorChunkSpec(1),)``).
* the schedules always split ``target`` along dim 0, so the target is kept
  batch-first [B, T] and the loss function transposes it back.

Timing: after start-up and one warm-up step, each rank waits at a barrier, times
``schedule.step(...)`` and the two times are all-reduced with MAX; the best of
``reps`` such steps is reported. Process start-up is not timed.
"""

import argparse
import math
import os
import socket
import tempfile
import time
from datetime import timedelta
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "SIZES",
    "LanguageModel",
    "Stage0",
    "Stage1",
    "layer_flops",
    "balanced_split",
    "split_model",
    "loss_fn",
    "time_pipelining",
    "best_pipelining",
    "main",
]

# (vocab, emb, hidden, layers, T, B)
SIZES = {
    True: dict(vocab=1000, emb=128, hidden=256, layers=4, T=64, B=16),
    False: dict(vocab=10_000, emb=512, hidden=1024, layers=4, T=256, B=32),
}
SCHEDULES = ("gpipe", "1f1b")
NUM_STAGES = 2


class LanguageModel(nn.Module):
    """Embedding -> multi-layer nn.LSTM -> Linear decoder; [T, B] int64 -> [T, B, vocab] logits."""

    def __init__(self, vocab: int, emb: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x))
        return self.decoder(out)


class Stage0(nn.Module):
    """Embedding + the first LSTM layers: [T, b] int64 -> [T, b, hidden]."""

    def __init__(self, embedding: nn.Embedding, lstm: nn.LSTM):
        super().__init__()
        self.embedding = embedding
        self.lstm = lstm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x))
        return out


class Stage1(nn.Module):
    """The remaining LSTM layers + decoder: [T, b, hidden] -> [T, b, vocab] logits."""

    def __init__(self, lstm: nn.LSTM, decoder: nn.Linear):
        super().__init__()
        self.lstm = lstm
        self.decoder = decoder

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(h)
        return self.decoder(out)


def layer_flops(vocab: int, emb: int, hidden: int, layers: int) -> List[float]:
    """Forward FLOPs per token of [LSTM layer 0, ..., LSTM layer L-1, decoder] (embedding ~ 0)."""
    lstm = [8.0 * hidden * ((emb if i == 0 else hidden) + hidden) for i in range(layers)]
    return lstm + [2.0 * hidden * vocab]


def balanced_split(vocab: int, emb: int, hidden: int, layers: int) -> int:
    """k (1 <= k < layers): stage 0 gets LSTM layers [0, k), the one that minimises the larger stage's FLOPs."""
    f = layer_flops(vocab, emb, hidden, layers)
    return min(range(1, layers), key=lambda k: max(sum(f[:k]), sum(f[k:])))


def _sub_lstm(lstm: nn.LSTM, start: int, stop: int) -> nn.LSTM:
    """A copy of layers [start, stop) of a (unidirectional, no proj) nn.LSTM as its own nn.LSTM."""
    if lstm.bidirectional or lstm.proj_size:
        raise ValueError("only unidirectional nn.LSTM without projections can be split")
    sub = nn.LSTM(
        lstm.input_size if start == 0 else lstm.hidden_size,
        lstm.hidden_size,
        num_layers=stop - start,
        bias=lstm.bias,
        batch_first=lstm.batch_first,
        dropout=lstm.dropout,
    )
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if lstm.bias else [])
    with torch.no_grad():
        for i in range(stop - start):
            for n in names:
                getattr(sub, f"{n}_l{i}").copy_(getattr(lstm, f"{n}_l{start + i}"))
    return sub


def split_model(model: LanguageModel, k: int) -> Tuple[Stage0, Stage1]:
    """The two stages (copies of the weights) with LSTM layers [0, k) in stage 0 and [k, L) in stage 1."""
    import copy

    layers = model.lstm.num_layers
    if not 1 <= k < layers:
        raise ValueError(f"split k={k} must be in [1, {layers})")
    return (
        Stage0(copy.deepcopy(model.embedding), _sub_lstm(model.lstm, 0, k)),
        Stage1(_sub_lstm(model.lstm, k, layers), copy.deepcopy(model.decoder)),
    )


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the tokens of time-major logits [T, b, V] and a batch-first target [b, T].

    (The pipelining schedules split ``target`` along dim 0, hence batch-first.)
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.t().reshape(-1))


def make_data(vocab: int, T: int, B: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input [T, B], target [B, T]) int64, the same in every process for the same seed."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (T, B), generator=g), torch.randint(0, vocab, (B, T), generator=g)


def _check_args(schedule: str, micro_batches: int, B: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
    if micro_batches < 1 or B % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide the batch size B={B}")
    if schedule == "1f1b" and micro_batches < NUM_STAGES:
        # torch.distributed.pipelining.Schedule1F1B raises for n_microbatches < num_stages
        raise ValueError(f"1f1b needs at least {NUM_STAGES} micro-batches (got {micro_batches})")


def _worker(rank: int, port: int, schedule: str, micro_batches: int, quick: bool, reps: int,
            seed: int, timeout_s: float, result_path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining.microbatch import TensorChunkSpec

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=NUM_STAGES, timeout=timedelta(seconds=timeout_s))
    try:
        s = SIZES[quick]
        vocab, emb, hidden, layers, T, B = s["vocab"], s["emb"], s["hidden"], s["layers"], s["T"], s["B"]
        torch.manual_seed(seed)
        model = LanguageModel(vocab, emb, hidden, layers)
        k = balanced_split(vocab, emb, hidden, layers)
        submod = split_model(model, k)[rank]
        del model
        x, target = make_data(vocab, T, B, seed)
        mb = B // micro_batches
        # static shapes of one micro-batch (no runtime shape inference). The float examples must
        # say requires_grad=True: in static mode PipelineStage derives the gradient buffers from
        # them and silently exchanges no gradient for an example without it.
        if rank == 0:
            example_in = torch.zeros(T, mb, dtype=torch.long)
            example_out = torch.empty(T, mb, hidden, requires_grad=True)
        else:
            example_in = torch.empty(T, mb, hidden, requires_grad=True)
            example_out = torch.empty(T, mb, vocab, requires_grad=True)
        stage = PipelineStage(submod, rank, NUM_STAGES, torch.device("cpu"),
                              input_args=example_in, output_args=example_out)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        sched = cls(stage, micro_batches, loss_fn=loss_fn, args_chunk_spec=(TensorChunkSpec(1),))

        best = math.inf
        for i in range(reps + 1):  # the first one warms up
            submod.zero_grad(set_to_none=True)
            losses: list = []
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=target, losses=losses, return_outputs=False)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if rank == NUM_STAGES - 1:
                if len(losses) != micro_batches or not all(torch.isfinite(l).all() for l in losses):
                    raise RuntimeError(f"bad micro-batch losses from the last stage: {losses}")
            if rank == 0 and submod.embedding.weight.grad is None:
                raise RuntimeError("stage 0 got no gradient")
            if i > 0:
                best = min(best, elapsed.item())
        dist.barrier()
        if rank == 0:
            with open(result_path, "w") as f:
                f.write(repr(best))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timeout_s(quick: bool, reps: int) -> float:
    """Generous wall-clock limit for one measurement (start-up + warm-up + reps steps)."""
    return 120.0 + (reps + 1) * (60.0 if quick else 900.0)


def time_pipelining(schedule: str, micro_batches: int, *, quick: bool, reps: int, seed: int = 0) -> float:
    """Best (min) seconds of one training step over `reps` timed steps after 1 warm-up,
    schedule in {"gpipe", "1f1b"}, measured with 2 gloo processes (spawned with
    torch.multiprocessing on a free localhost port), 1 thread each."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        raise RuntimeError("torch.distributed with the gloo backend is not available in this build of torch")
    _check_args(schedule, micro_batches, SIZES[quick]["B"])
    if reps < 1:
        raise ValueError(f"reps must be >= 1, not {reps}")
    timeout = _timeout_s(quick, reps)
    for attempt in range(3):
        with tempfile.TemporaryDirectory(prefix="pipelining_peer") as d:
            result_path = os.path.join(d, "seconds")
            ctx = mp.start_processes(
                _worker,
                args=(_free_port(), schedule, micro_batches, quick, reps, seed, timeout, result_path),
                nprocs=NUM_STAGES,
                join=False,
                start_method="spawn",
            )
            deadline = time.monotonic() + timeout
            try:
                while not ctx.join(timeout=1.0):
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"pipelining peer ({schedule}, {micro_batches} micro-batches) did not finish "
                            f"within {timeout:.0f} s")
            except mp.ProcessRaisedException as e:
                # the port picked can be taken before rank 0 binds it: try another one
                if attempt < 2 and ("EADDRINUSE" in str(e) or "address already in use" in str(e).lower()):
                    continue
                raise
            finally:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                for p in ctx.processes:
                    p.join(5)
                    if p.is_alive():
                        p.kill()
                        p.join()
            with open(result_path) as f:
                seconds = float(f.read())
        if not math.isfinite(seconds) or seconds <= 0:
            raise RuntimeError(f"pipelining peer measured a bad step time: {seconds}")
        return seconds
    raise AssertionError("unreachable")


def best_pipelining(quick: bool, reps: int, micro_batch_choices=(1, 2, 4, 8, 16)) -> List[Tuple[str, int, float]]:
    """[(schedule, micro_batches, seconds), ...] for both schedules and every choice that divides B.

    (1f1b with 1 micro-batch, which Schedule1F1B rejects and which would be GPipe anyway, is left out.)
    """
    return _measure(SCHEDULES, micro_batch_choices, quick, reps)


def _measure(schedules: Sequence[str], choices: Sequence[int], quick: bool, reps: int,
             verbose: bool = False) -> List[Tuple[str, int, float]]:
    B = SIZES[quick]["B"]
    rows = []
    for schedule in schedules:
        for m in choices:
            if m < 1 or B % m or (schedule == "1f1b" and m < NUM_STAGES):
                if verbose:
                    print(f"  {schedule} M={m}: skipped (does not divide B={B}, or 1f1b needs >= "
                          f"{NUM_STAGES} micro-batches)", flush=True)
                continue
            seconds = time_pipelining(schedule, m, quick=quick, reps=reps)
            if verbose:
                print(f"  {schedule} M={m}: {seconds:.3f} s", flush=True)
            rows.append((schedule, m, seconds))
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench pipelining")
    ap.add_argument("--quick", action="store_true", help="a small model (vocab 1k, 128, H=256, T=64, B=16)")
    ap.add_argument("--reps", type=int, default=None, help="timed steps per configuration (default 3, full size 1)")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=None,
                    help="micro-batch counts to try (default 1 2 4 8 16, those that divide B)")
    ap.add_argument("--schedules", nargs="*", choices=SCHEDULES, default=None, help="default: gpipe 1f1b")
    args = ap.parse_args(argv)
    s = SIZES[args.quick]
    reps = args.reps if args.reps is not None else (3 if args.quick else 1)
    choices = args.micro_batches or [1, 2, 4, 8, 16]
    schedules = args.schedules or list(SCHEDULES)
    for m in choices:
        if m < 1 or s["B"] % m:
            ap.error(f"--micro-batches {m} does not divide B={s['B']}")
    k = balanced_split(s["vocab"], s["emb"], s["hidden"], s["layers"])
    f = layer_flops(s["vocab"], s["emb"], s["hidden"], s["layers"])
    print(f"model: Embedding({s['vocab']}, {s['emb']}) -> nn.LSTM(H={s['hidden']}, {s['layers']} layers) -> "
          f"Linear({s['hidden']}, {s['vocab']}); T={s['T']}, B={s['B']}; one training step (forward + backward, "
          f"cross-entropy), best of {reps} after 1 warm-up")
    span = lambda a, b: f"LSTM layer {a}" if a == b else f"LSTM layers {a}-{b}"  # noqa: E731
    print(f"torch.distributed.pipelining, 2 stages in 2 gloo processes, 1 thread each: stage 0 = embedding + "
          f"{span(0, k - 1)}, stage 1 = {span(k, s['layers'] - 1)} + decoder "
          f"(forward MFLOP/token {sum(f[:k]) / 1e6:.2f} : {sum(f[k:]) / 1e6:.2f})", flush=True)
    rows = _measure(schedules, choices, args.quick, reps, verbose=True)
    head = ("schedule", "micro-batches", "step (s)")
    body = [(sch, str(m), f"{sec:.3f}") for sch, m, sec in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(fmt(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print(fmt(b))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
