"""python -m pipelstm.bench pipeline: the in-process pipeline on the CPU, in one run.

The pipeline issue's model, Embedding (vocab 10k, 512) -> 4 LSTM layers
(H=1024) -> decoder, T=256, B=32 (``--quick``: vocab 1k, 128, H=256, T=64,
B=16), one training step (forward, cross-entropy against random targets
averaged over the tokens, backward).

One thread per stage stands in for one device per stage: the stages are
CPU threads of one process, one core each. What a CPU user would run
instead of N such stages is the same model as one process with N intra-op
threads, the equal-cores baseline, so that is measured too. Every
configuration runs in a process of its own that stays up for the whole run
(:class:`pipelstm.bench.groups.Group`), as a user's training script would,
and the processes take turns of ``STEPS_PER_TURN`` steps in a row, the
last one timed (``bench lm`` says why: with all configurations in one
process, nn.LSTM's steps had run well above their time alone). Every
figure is the median of ``--reps`` turns (after a warm-up turn each):

* ``pipelstm.Pipeline`` with 1 stage of 1 thread: the single-device model;
* ``pipelstm.Pipeline`` with 2 stages of 1 thread each, for every K x M
  asked for, with the measured bubble (idle fraction of the stages,
  forward and backward passes averaged) next to the theoretical
  (S-1)/(K*M+S-1), and each stage's busy time (forward + backward), both
  taken from the median step itself;
* the equal-cores baseline (:mod:`pipelstm.bench.baseline`): the model as one
  process with 2 intra-op threads, on ``torch.nn.LSTM`` and on
  ``pipelstm.LSTM``;
* the peer, ``torch.distributed.pipelining`` (ScheduleGPipe, Schedule1F1B)
  over 2 gloo processes with nn.LSTM stages at the same split, for each
  micro-batch count asked for.

pipelstm computes the loss as the pipeline's last unit (``loss_fn=``); with
``--loss-outside`` on the caller's thread from the returned logits instead.

Memory: the stages share one process, so the system cannot tell their
peaks apart. Measured: what the engine kept for backward in the median
step, all stages together (``Pipeline.saved_activation_bytes``, bytes of
the saved tensors' storage). Estimated per stage from ``Pipeline.plan``:
weights + their gradients + activations kept for backward at this batch,
next to the same for the single-stage model. ``bench distributed`` (one
process per stage) measures each stage's peak resident memory.
"""

import argparse
import statistics
import sys
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import LSTM, Pipeline
from ..timeline import bubbles
from . import baseline, report
from .baseline import KINDS
from .groups import STEPS_PER_TURN, Group, close_all, take_turns
from .pipelining_peer import SIZES, make_data, peer_configs, start_peer
from .table import Column, markdown
from .timing import median_index, spread

__all__ = ["CONFIG_COLUMNS", "step_columns", "build", "describe", "add_ratios", "stage_busy", "stage_memory",
           "PipelineStep", "setup_pipeline", "start_comparisons", "parse_grid_arguments", "main"]

STAGES = 2
MIB = 1 / 2**20


def build(vocab: int, emb: int, hidden: int, layers: int) -> nn.Sequential:
    return nn.Sequential(nn.Embedding(vocab, emb), LSTM(emb, hidden, num_layers=layers), nn.Linear(hidden, vocab))


def describe(s: dict) -> str:
    """The model :func:`build` makes from a size of ``SIZES``, as the benches' notes name it."""
    return (f"Embedding({s['vocab']}, {s['emb']}) -> {s['layers']} x LSTM(H={s['hidden']}) -> "
            f"Linear({s['hidden']}, {s['vocab']})")


def add_ratios(rows: List[dict]) -> Optional[dict]:
    """Compares every configuration with the first (one stage or process) and with the fastest pipelined one.

    Args:
        rows: one per configuration, each with ``seconds`` (its median step) and ``kind``; the first is
            the one-stage run; the pipelined ones are the ``pipelstm`` rows with a ``K``.

    Returns:
        The fastest pipelined row, or None where there is none (``best_vs`` is then against the first).
        Every row gets ``vs_one`` (the first row's step time over its own) and ``best_vs`` (its own over
        the fastest pipelined row's).
    """
    pipelined = [r for r in rows if r["kind"] == "pipelstm" and r.get("K") is not None]
    best = min(pipelined, key=lambda r: r["seconds"]) if pipelined else None
    for r in rows:
        r.update(vs_one=rows[0]["seconds"] / r["seconds"], best_vs=r["seconds"] / (best or rows[0])["seconds"])
    return best


def stage_busy(events: Sequence[dict], stages: int) -> List[float]:
    """Seconds each stage computed (forward + backward) in a trace's spans, transfers left out."""
    busy = [0.0] * stages
    for e in events:
        if e["phase"] != "transfer":
            busy[e["stage"]] += (e["end_ns"] - e["start_ns"]) / 1e9
    return busy


class PipelineStep:
    """One training step of a Pipeline, timed; keeps each step's figures in ``runs``
    (busy seconds per stage, bubbles, bytes kept for backward)."""

    def __init__(self, pipe: Pipeline, x: torch.Tensor, target: torch.Tensor) -> None:
        self.pipe, self.x, self.target = pipe, x, target  # target [B, T] as the peer's
        self.runs: List[dict] = []

    def __call__(self) -> float:
        pipe = self.pipe
        start = time.perf_counter()
        pipe.zero_grad(set_to_none=True)
        if pipe.core.loss is not None:
            loss, _ = pipe(self.x, target=self.target.t())
        else:
            out, _ = pipe(self.x)
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), self.target.t().reshape(-1))
        loss.backward()
        seconds = time.perf_counter() - start
        events = pipe.trace()
        S = len(pipe.balance)
        _, b = bubbles(events, S)
        self.runs.append(dict(
            busy=stage_busy(events, S), kept=pipe.saved_activation_bytes,
            bubble=(b.get("forward_bubble", 0.0) + b.get("backward_bubble", 0.0)) / 2 if S > 1 else None,
            theory=b["theoretical_bubble"] if S > 1 else None,
        ))
        return seconds


def stage_memory(pipe: Pipeline, tokens: int) -> List[float]:
    """Estimated bytes per stage from ``pipe.plan``: weights and their
    gradients (fp32) + activations kept for backward for ``tokens`` tokens."""
    return [2 * 4 * r["params"] + r["act_bytes"] * tokens for r in pipe.plan.rows]


def _pipeline(quick: bool, stages: int, chunks: int, micro_batches: int, loss_outside: bool):
    """(the Pipeline of the bench's model, its PipelineStep): the same weights and data in every process."""
    s = SIZES[quick]
    torch.manual_seed(0)
    base = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
    x, target = make_data(s["vocab"], s["T"], s["B"], seed=0)
    pipe = Pipeline(base, devices=["cpu"] * stages, chunks=chunks, micro_batches=micro_batches, threads=1,
                    loss_fn=None if loss_outside else nn.CrossEntropyLoss())
    return pipe, PipelineStep(pipe, x, target)


class _PipelineWorkload:
    """One pipeline configuration in a process of its own (a Group workload)."""

    def __init__(self, quick: bool, stages: int, chunks: int, micro_batches: int, loss_outside: bool) -> None:
        self.pipe, self._step = _pipeline(quick, stages, chunks, micro_batches, loss_outside)
        s = SIZES[quick]
        self._fixed = dict(balance=list(self.pipe.balance), stage_est=stage_memory(self.pipe, s["T"] * s["B"]))

    def step(self) -> None:
        self._step()

    def info(self) -> dict:
        """The last step's figures (busy, bubbles, kept), the balance and the memory estimate."""
        return dict(self._step.runs[-1], **self._fixed)


def setup_pipeline(rank: int, world: int, **kwargs) -> _PipelineWorkload:
    """A :class:`pipelstm.bench.groups.Group` workload: one pipeline configuration."""
    if world != 1:
        raise ValueError(f"a pipeline configuration is one process, not {world}")
    return _PipelineWorkload(**kwargs)


def start_comparisons(quick: bool, peer_micro_batches: Sequence[int],
                      timeout: float = 1800.0) -> Iterator[Tuple[dict, Group]]:
    """Starts what the pipelines are compared with, in ``bench pipeline`` and ``bench distributed`` alike.

    Args:
        quick: the small model of ``SIZES``.
        peer_micro_batches: micro-batch counts to try for torch.distributed.pipelining (see ``peer_configs``).
        timeout: seconds the equal-cores groups may take to answer.

    Returns:
        One (row, started group) at a time: the model as one process with ``STAGES`` intra-op threads (each
        kind of ``KINDS``: equal cores), then torch.distributed.pipelining on ``STAGES`` processes of one
        thread (each schedule and micro-batch count); the caller closes the groups it got.
    """
    for kind in KINDS:
        yield (dict(config=f"{kind} model, 1 process x {STAGES} threads (equal cores)", kind="baseline"),
               Group(f"{kind} model", 1, baseline.setup, timeout=timeout, kind=kind, quick=quick, threads=STAGES))
    for schedule, mb in peer_configs(quick, peer_micro_batches):
        yield (dict(config=f"torch.distributed.pipelining {schedule}, {STAGES} processes x 1 thread", M=mb,
                    kind="peer"), start_peer(schedule, mb, quick=quick))


# The columns that name a configuration: what runs, its chunks K and its micro-batches M.
CONFIG_COLUMNS = [Column("config", "configuration"), Column("K", "K"), Column("M", "M")]


def step_columns(one: str, best: str) -> List[Column]:
    """The step-time columns of ``bench pipeline`` and ``bench distributed``: the median step, its spread
    and the two ratios :func:`add_ratios` adds.

    Args:
        one: the first configuration as the ``vs_one`` header names it (``"1 stage"``).
        best: the fastest pipelined configurations as the ``best_vs`` header names them.

    Returns:
        The columns ``seconds``, ``spread``, ``vs_one`` and ``best_vs``.
    """
    return [Column("seconds", "step (s), median", "{:.3f}"), Column("spread", "min-max (s)"),
            Column("vs_one", f"vs {one}", "{:.2f}x"), Column("best_vs", f"best {best} vs this", "{:.2f}x")]


COLUMNS = CONFIG_COLUMNS + step_columns("1 stage", "2-stage pipelstm") + [
    Column("bubble", "bubble (measured)", "{:.3f}"), Column("theory", "bubble (theory)", "{:.3f}"),
    Column("busy", "stage busy (s)", "{:.2f}"),
]
MEMORY_COLUMNS = CONFIG_COLUMNS + [
    Column("stage_est", "per stage, est. (MiB)", "{:.0f}", MIB),
    Column("single_est", "1 stage, est. (MiB)", "{:.0f}", MIB),
    Column("largest_of_single", "largest stage / 1 stage", "{:.2f}"),
    Column("kept", "kept for backward, all stages, measured (MiB)", "{:.0f}", MIB),
]


def parse_grid_arguments(ap: argparse.ArgumentParser, argv: List[str], name: str,
                         chunks: List[int]) -> Tuple[argparse.Namespace, dict, str]:
    """The start of ``bench pipeline`` and ``bench distributed``: the options they share (the model's size, the
    K x M grid of the pipelines, the peer's micro-batch counts, the timed steps) added to the bench's parser,
    the command line parsed, the run's metadata taken and the model named.

    Args:
        ap: the bench's parser, with its own options.
        argv: the command line after the bench's name.
        name: the bench's name, for its metadata.
        chunks: the K values tried by default.

    Returns:
        ``(the parsed arguments, the run's metadata, the model and its batch as the notes name them)``.

    Raises:
        SystemExit: through the parser, for a bad command line.
    """
    ap.add_argument("--quick", action="store_true", help="a small model (vocab 1k, 128, H=256, T=64, B=16)")
    ap.add_argument("--chunks", type=int, nargs="*", default=chunks, help="K values to try")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=[1, 2], help="M values to try")
    ap.add_argument("--peer-micro-batches", type=int, nargs="*", default=[2, 4, 8],
                    help="micro-batch counts for the torch.distributed.pipelining peer (none: skip the peer)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per configuration (median; at least 5)")
    args = report.parse_arguments(ap, argv, "--reps")
    s = SIZES[args.quick]
    return args, report.metadata(name, argv), f"{describe(s)}; T={s['T']}, B={s['B']}"


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench pipeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeline", default=None, help="write the best 2-stage run's timeline here (.json, + .png)")
    ap.add_argument("--loss-outside", action="store_true",
                    help="compute the loss on the caller's thread from the logits, not as the pipeline's last unit")
    args, meta, model = parse_grid_arguments(ap, argv, "pipeline", chunks=[8, 16])
    print(f"model: {model}; one training step (forward, cross-entropy, backward); median of {args.reps} steps, "
          f"each configuration in a process of its own, all in turns of {STEPS_PER_TURN} steps, the last timed. "
          f"One thread per stage stands in for one device per stage; the equal-cores baseline is the model as "
          f"one process with {STAGES} intra-op threads.", flush=True)

    rows: List[dict] = []  # one per configuration, beside its group
    groups: List[Group] = []
    piped = dict(quick=args.quick, loss_outside=args.loss_outside)
    try:
        rows.append(dict(config="pipelstm Pipeline, 1 stage x 1 thread", kind="pipelstm"))
        groups.append(Group("pipeline, 1 stage", 1, setup_pipeline, stages=1, chunks=1, micro_batches=1, **piped))
        for K in args.chunks:
            for M in args.micro_batches:
                rows.append(dict(config=None, K=K, M=M, kind="pipelstm"))  # config: with its balance
                groups.append(Group(f"pipeline K={K} M={M}", 1, setup_pipeline, stages=STAGES, chunks=K,
                                    micro_batches=M, **piped))
        for row, group in start_comparisons(args.quick, args.peer_micro_batches):
            rows.append(row)
            groups.append(group)
        print(f"timing {len(groups)} configurations, {args.reps} turns each after a warm-up turn", flush=True)
        times, infos = take_turns(groups, args.reps)
    finally:
        close_all(groups)

    for i, row in enumerate(rows):
        samples = times[str(i)]
        row.update(seconds=statistics.median(samples), spread=spread(samples), samples=samples)
        if row["kind"] == "pipelstm":  # figures of the median step itself (infos[i][0]: the warm-up turn's)
            run = infos[i][1:][median_index(samples)][0]  # its one rank
            if row.get("K") is not None:
                row["config"] = f"pipelstm Pipeline, {STAGES} stages {run['balance']} x 1 thread"
            row.update(busy=run["busy"], bubble=run["bubble"], theory=run["theory"], kept=run["kept"],
                       stage_est=run["stage_est"])
    best = add_ratios(rows)
    single = rows[0]["stage_est"][0]
    memory = [dict(config=r["config"], K=r.get("K"), M=r.get("M"), stage_est=r["stage_est"], single_est=single,
                   largest_of_single=max(r["stage_est"]) / single, kept=r["kept"]) for r in rows if "stage_est" in r]
    notes = [f"Model: {model}. One thread per stage stands in for one device per stage; the equal-cores rows are "
             f"what a CPU user would run instead: the same model as one process with {STAGES} intra-op threads.",
             f"Every step time is the median of {args.reps} steps, timed in the configuration's own process; the "
             f"configurations, each a process of its own, take turns of {STEPS_PER_TURN} steps in a row, the last "
             "one timed; bubbles and busy times come from the median step."]
    if best is not None:
        busy = best["busy"]
        notes.append(f"Balance bound of the best {STAGES}-stage split: {sum(busy) / max(busy):.2f}x (the stages' "
                     "busy time over the busier one's: no schedule can beat it).")
    notes.append("Memory: the stages share one process; per stage is an estimate from Pipeline.plan (weights + "
                 "gradients + activations kept for backward); the aim is at most 1/S of the 1-stage figure + 10 %. "
                 "Measured: the bytes the engine kept for backward, all stages together.")
    tables = [dict(title="Memory", columns=MEMORY_COLUMNS, rows=memory)]
    print(markdown(COLUMNS, rows))
    report.print_tables(tables)
    for note in notes[2:]:
        print(note)
    if args.timeline and best is not None:  # the best configuration again, in this process, for its picture
        pipe, step = _pipeline(args.quick, STAGES, best["K"], best["M"], args.loss_outside)
        for _ in range(STEPS_PER_TURN):
            step()
        print("timeline:", pipe.timeline(args.timeline))
    report.write_json(args.json, meta, COLUMNS, rows, notes=notes, tables=tables)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
