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

Timing: the two processes stay up (a :class:`pipelstm.bench.groups.Group`);
after start-up and one warm-up step, for every timed step each rank waits at
a barrier, times ``schedule.step(...)`` and the two times are all-reduced
with MAX; the median of ``--reps`` such steps is reported. Several
configurations are up at once and take turns step by step (interleaved).
Process start-up is not timed.
"""

import argparse
import math
import statistics
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import report
from .groups import Group, close_all
from .table import Column, markdown
from .timing import interleaved_times, spread

__all__ = [
    "SIZES",
    "LanguageModel",
    "Stage",
    "layer_flops",
    "balanced_split",
    "split_model",
    "loss_fn",
    "make_data",
    "setup_peer",
    "peer_configs",
    "start_peer",
    "time_pipelining",
    "main",
]

# (vocab, emb, hidden, layers, T, B)
SIZES = {
    True: dict(vocab=1000, emb=128, hidden=256, layers=4, T=64, B=16),
    False: dict(vocab=10_000, emb=512, hidden=1024, layers=4, T=256, B=32),
}
SCHEDULES = ("gpipe", "1f1b")
NUM_STAGES = 2


class Stage(nn.Module):
    """A run of the language model's layers in order: the embedding (the first stage's), LSTM layers and the
    decoder (the last stage's); [T, b] int64 with the embedding, else [T, b, hidden] -> [T, b, vocab] logits
    with the decoder, else [T, b, hidden]."""

    def __init__(self, lstm: nn.Module, embedding: Optional[nn.Embedding] = None,
                 decoder: Optional[nn.Linear] = None):
        super().__init__()
        self.embedding = embedding
        self.lstm = lstm
        self.decoder = decoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        out, _ = self.lstm(x)
        return out if self.decoder is None else self.decoder(out)


class LanguageModel(Stage):
    """Embedding -> multi-layer LSTM -> Linear decoder; [T, B] int64 -> [T, B, vocab] logits.

    ``lstm``: the LSTM class, ``nn.LSTM`` (default) or ``pipelstm.LSTM``
    (same parameters and initialisation: the same seed gives the same model).
    """

    def __init__(self, vocab: int, emb: int, hidden: int, layers: int, lstm: type = nn.LSTM):
        embedding = nn.Embedding(vocab, emb)  # made in this order: the seed's draws as before
        stack = lstm(emb, hidden, num_layers=layers)
        super().__init__(stack, embedding, nn.Linear(hidden, vocab))


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


def split_model(model: LanguageModel, k: int) -> Tuple[Stage, Stage]:
    """The two stages (copies of the weights) with LSTM layers [0, k) in stage 0 and [k, L) in stage 1."""
    import copy

    layers = model.lstm.num_layers
    if not 1 <= k < layers:
        raise ValueError(f"split k={k} must be in [1, {layers})")
    return (
        Stage(_sub_lstm(model.lstm, 0, k), embedding=copy.deepcopy(model.embedding)),
        Stage(_sub_lstm(model.lstm, k, layers), decoder=copy.deepcopy(model.decoder)),
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


class _PeerStep:
    """One rank's stage and schedule; ``step()`` is one training step (see the module's docstring)."""

    def __init__(self, rank: int, schedule: str, micro_batches: int, quick: bool, seed: int) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        from torch.distributed.pipelining.microbatch import TensorChunkSpec

        s = SIZES[quick]
        vocab, emb, hidden, layers, T, B = s["vocab"], s["emb"], s["hidden"], s["layers"], s["T"], s["B"]
        torch.manual_seed(seed)
        model = LanguageModel(vocab, emb, hidden, layers)
        k = balanced_split(vocab, emb, hidden, layers)
        self.submod = split_model(model, k)[rank]
        del model
        self.rank, self.micro_batches = rank, micro_batches
        self.x, self.target = make_data(vocab, T, B, seed)
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
        stage = PipelineStage(self.submod, rank, NUM_STAGES, torch.device("cpu"),
                              input_args=example_in, output_args=example_out)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = cls(stage, micro_batches, loss_fn=loss_fn, args_chunk_spec=(TensorChunkSpec(1),))

    def step(self) -> None:
        self.submod.zero_grad(set_to_none=True)
        losses: list = []
        if self.rank == 0:
            self.schedule.step(self.x)
        else:
            self.schedule.step(target=self.target, losses=losses, return_outputs=False)
        if self.rank == NUM_STAGES - 1:
            if len(losses) != self.micro_batches or not all(torch.isfinite(l).all() for l in losses):
                raise RuntimeError(f"bad micro-batch losses from the last stage: {losses}")
        if self.rank == 0 and self.submod.embedding.weight.grad is None:
            raise RuntimeError("stage 0 got no gradient")


def setup_peer(rank: int, world: int, schedule: str, micro_batches: int, quick: bool, seed: int = 0) -> _PeerStep:
    """A :class:`pipelstm.bench.groups.Group` workload: this rank's stage under ``schedule``."""
    if world != NUM_STAGES:
        raise ValueError(f"the peer runs {NUM_STAGES} processes, not {world}")
    return _PeerStep(rank, schedule, micro_batches, quick, seed)


def _timeout_s(quick: bool) -> float:
    """Generous wall-clock limit for one wait (start-up, or one step)."""
    return 120.0 + (60.0 if quick else 900.0)


def peer_configs(quick: bool, choices: Sequence[int] = (1, 2, 4, 8, 16),
                 schedules: Sequence[str] = SCHEDULES) -> List[Tuple[str, int]]:
    """(schedule, micro-batches) for every schedule and choice that divides B
    (1f1b with 1 micro-batch, which Schedule1F1B rejects and which would be
    GPipe anyway, is left out)."""
    B = SIZES[quick]["B"]
    return [(sch, m) for sch in schedules for m in choices
            if m >= 1 and B % m == 0 and not (sch == "1f1b" and m < NUM_STAGES)]


def start_peer(schedule: str, micro_batches: int, *, quick: bool, seed: int = 0) -> Group:
    """Starts the 2 gloo processes of one peer configuration (without waiting
    for them); ``group.step()`` then times one training step."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        raise RuntimeError("torch.distributed with the gloo backend is not available in this build of torch")
    _check_args(schedule, micro_batches, SIZES[quick]["B"])
    return Group(f"torch.distributed.pipelining {schedule} M={micro_batches}", NUM_STAGES, setup_peer,
                 timeout=_timeout_s(quick), schedule=schedule, micro_batches=micro_batches, quick=quick, seed=seed)


def time_pipelining(schedule: str, micro_batches: int, *, quick: bool, reps: int, seed: int = 0) -> float:
    """Median seconds of one training step over ``reps`` timed steps after 1
    warm-up, schedule in {"gpipe", "1f1b"}, measured with 2 gloo processes,
    1 thread each."""
    _check_args(schedule, micro_batches, SIZES[quick]["B"])
    if reps < 1:
        raise ValueError(f"reps must be >= 1, not {reps}")
    with start_peer(schedule, micro_batches, quick=quick, seed=seed) as group:
        seconds = statistics.median(interleaved_times({"peer": group.step}, reps)["peer"])
    if not math.isfinite(seconds) or seconds <= 0:
        raise RuntimeError(f"pipelining peer measured a bad step time: {seconds}")
    return seconds


COLUMNS = [Column("schedule", "schedule"), Column("micro_batches", "micro-batches"),
           Column("seconds", "step (s), median", "{:.3f}"), Column("spread", "min-max (s)")]


def main(argv: Optional[List[str]] = None) -> List[dict]:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench pipelining")
    ap.add_argument("--quick", action="store_true", help="a small model (vocab 1k, 128, H=256, T=64, B=16)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per configuration (median; at least 5)")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=None,
                    help="micro-batch counts to try (default 1 2 4 8 16, those that divide B)")
    ap.add_argument("--schedules", nargs="*", choices=SCHEDULES, default=None, help="default: gpipe 1f1b")
    args = report.parse_arguments(ap, argv, "--reps")
    meta = report.metadata("pipelining", argv)
    s = SIZES[args.quick]
    choices = args.micro_batches or [1, 2, 4, 8, 16]
    for m in choices:
        if m < 1 or s["B"] % m:
            ap.error(f"--micro-batches {m} does not divide B={s['B']}")
    k = balanced_split(s["vocab"], s["emb"], s["hidden"], s["layers"])
    f = layer_flops(s["vocab"], s["emb"], s["hidden"], s["layers"])
    print(f"model: Embedding({s['vocab']}, {s['emb']}) -> nn.LSTM(H={s['hidden']}, {s['layers']} layers) -> "
          f"Linear({s['hidden']}, {s['vocab']}); T={s['T']}, B={s['B']}; one training step (forward + backward, "
          f"cross-entropy), median of {args.reps} interleaved steps after 1 warm-up")
    span = lambda a, b: f"LSTM layer {a}" if a == b else f"LSTM layers {a}-{b}"  # noqa: E731
    split = (f"stage 0 = embedding + {span(0, k - 1)}, stage 1 = {span(k, s['layers'] - 1)} + decoder "
             f"(forward MFLOP/token {sum(f[:k]) / 1e6:.2f} : {sum(f[k:]) / 1e6:.2f})")
    print(f"torch.distributed.pipelining, 2 stages in 2 gloo processes, 1 thread each: {split}", flush=True)
    configs = peer_configs(args.quick, choices, args.schedules or SCHEDULES)
    groups = []
    try:
        for sch, m in configs:
            groups.append(start_peer(sch, m, quick=args.quick))
        times = interleaved_times({g.name: g.step for g in groups}, args.reps)
    finally:
        close_all(groups)
    rows = [dict(schedule=sch, micro_batches=m, seconds=statistics.median(times[g.name]),
                 spread=spread(times[g.name]), samples=times[g.name]) for (sch, m), g in zip(configs, groups)]
    print(markdown(COLUMNS, rows))
    report.write_json(args.json, meta, COLUMNS, rows, notes=[f"Split: {split}."])
    return rows

if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
