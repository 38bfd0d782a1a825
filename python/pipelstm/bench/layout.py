"""``python -m pipelstm.bench layout``: the automatic layout against every layout this machine runs.

The pipeline benchmark's small language model (Embedding(1000, 128) -> 4 x
LSTM(H=256) -> Linear(256, 1000), T=64, global batch B=16, the
cross-entropy inside the last stage), one training step on the CPU's 2
cores, in every way that uses them:

* ``PipelineParallel`` over gloo, one thread a process: pp=1 x dp=2 and
  pp=2 x dp=1, at several K x M;
* ``pipelstm.Pipeline`` in one process: 2 stages of one thread each at
  several K x M, and 1 stage of 2 threads.

First the automatic layout plans, as ``init_mesh(pp="auto")`` does: the
units calibrated in this process (``pipelstm.simulator.Calibrator``, one
thread, and two for the 2-thread stage, the two taking turns round by
round, ``CALIBRATION_ROUNDS`` each, so that a slow spell of the machine
falls on both alike rather than on the one it compares against the
other), the gloo loopback link, the
all-reduce and the compute sharing measured between two processes
(``measure_machine``), and ``choose_layout`` over the three kinds; the
choice is the simplest (fewest processes, stages, items) of those
predicted within the plan's margin of the fastest (``PLAN_MARGIN``). Then every layout, the choice included
(with its balance), runs in processes of its own that take turns
(``bench.groups``: the median of ``--reps`` turns of 2 steps, the last
timed). Then the choice and the grid's fastest run again, the two alone in
fresh turns (``HEAD_TO_HEAD_REPS`` or twice ``--reps``, whichever is more),
and the choice's median is set against the fastest's: the grid's fastest
is the least of many noisy medians, so against its grid figure any other
layout looks slower than it is. Where the choice is the grid's fastest
layout itself, it is the best measured (ratio 1.0), and the head-to-head
gives the noise between two process groups of one layout.
All of it ``--runs`` times from scratch: the plan can choose differently
when two layouts are predicted close, and the measurements move between
runs too; the table is the last run's, the notes give every run's choice.
"""

import argparse
import functools
import statistics
import sys
from typing import List, Optional

import torch
from torch import nn

from .. import simulator as sim
from ..pipeline import Pipeline
from ..simulator.calibrate import model_step
from ..simulator.clusters import local_machine, measure_machine
from ..simulator.layout import PLAN_MARGIN, choose_layout, search_sizes, simplest
from . import report
from .groups import STEPS_PER_TURN, Group, close_all, take_turns
from .pipeline import PipelineStep, build, describe
from .pipelining_peer import SIZES, make_data
from .table import Column, markdown

__all__ = ["setup_layout", "main"]

# (kind, pp, dp, threads per stage, K, M)
GRID = ([("pipeline", 1, 1, 2, K, M) for K, M in ((1, 1), (4, 1))]
        + [("pipeline", 2, 1, 1, K, M) for K, M in ((1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (8, 2))]
        + [("parallel", 1, 2, 1, K, M) for K, M in ((1, 1), (2, 1))]
        + [("parallel", 2, 1, 1, K, M) for K, M in ((1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (8, 2))])
# Turns of the choice against the grid's fastest, head to head (at least).
HEAD_TO_HEAD_REPS = 15
# Timed rounds of each calibration (the median per unit and size).
CALIBRATION_ROUNDS = 5
COLUMNS = [
    Column("config", "layout"), Column("K", "K"), Column("M", "M"), Column("balance", "balance"),
    Column("seconds", "measured step (s), median", "{:.4f}"), Column("spread", "min-max (s)"),
    Column("predicted", "predicted (s)", "{:.4f}"), Column("vs_best", "measured / best", "{:.2f}x"),
    Column("chosen", "automatic choice"),
]


class _Step:
    """One layout of the bench's model in this process (a Group workload)."""

    def __init__(self, kind: str, pp: int, threads: int, chunks: int, micro_batches: int, balance) -> None:
        s = SIZES[True]
        torch.manual_seed(0)
        model = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
        x, target = make_data(s["vocab"], s["T"], s["B"], seed=0)  # target [B, T]
        loss = nn.CrossEntropyLoss()
        if kind == "pipeline":
            self.pipe = Pipeline(model, devices=["cpu"] * pp, chunks=chunks, micro_batches=micro_batches,
                                 threads=threads, loss_fn=loss, balance=balance or "auto")
            self._step = PipelineStep(self.pipe, x, target)
        else:
            from .. import distributed as pdist

            mesh = pdist.init_mesh(pp=pp, timeout=600.0)
            self.pipe = pdist.PipelineParallel(model, mesh, chunks=chunks, micro_batches=micro_batches,
                                               threads=threads, carry_state=False, loss_fn=loss,
                                               balance=balance or "auto")
            xs, ts = mesh.shard(x), mesh.shard(target.t().contiguous())
            self._step = lambda: (self.pipe.zero_grad(set_to_none=True), self.pipe.train_step(xs, ts))

    def step(self) -> None:
        self._step()

    def info(self) -> dict:
        return dict(balance=list(self.pipe.balance))


def setup_layout(rank: int, world: int, kind: str, pp: int, threads: int, chunks: int, micro_batches: int,
                 balance=None) -> _Step:
    """A :class:`pipelstm.bench.groups.Group` workload: one layout of the bench's model."""
    return _Step(kind, pp, threads, chunks, micro_batches, balance)


def _name(kind: str, pp: int, dp: int, threads: int) -> str:
    if kind == "pipeline":
        return f"Pipeline, {pp} stage{'s' if pp > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
    return f"PipelineParallel pp={pp} x dp={dp} (gloo, 1 thread each)"


def machine(processes: int, measured: tuple) -> sim.Cluster:
    """This machine as ``processes`` processes, from what ``measure_machine()`` measured."""
    return local_machine(processes, **measured._asdict())


def calibrations(model: nn.Module, loss: nn.Module, sizes) -> tuple:
    """The units' costs with one thread and with two, the two calibrations
    taking turns round by round, so that a slow spell of the machine falls
    on both alike rather than on one of the two the plan compares."""
    calibrators = [sim.Calibrator(model, loss_fn=loss, threads=n, sizes=sizes) for n in (1, 2)]
    for _ in range(CALIBRATION_ROUNDS):
        for c in calibrators:
            c.round()
    return tuple(c.costs() for c in calibrators)


def plan(model: nn.Module, T: int, B: int, measured: tuple):
    """The automatic choice over the three kinds: (kind, pp, dp, threads, plan), the plans of each kind."""
    loss = nn.CrossEntropyLoss()
    sizes = search_sizes(T, B, 2)  # the item sizes the search reads, measured rather than extrapolated
    one, two = calibrations(model, loss, sizes)
    world = machine(2, measured)
    searches = [("parallel", 1, dict(costs=one, cluster=world)),
                ("pipeline", 1, dict(costs=one, cluster=world, pp=2, in_process=True)),
                ("pipeline", 2, dict(costs=two, cluster=machine(1, measured), in_process=True))]

    def each_kind(margin: float) -> list:
        return [(kind, threads, choose_layout(T=T, B=B, margin=margin, **kw)) for kind, threads, kw in searches]

    # Each kind's simplest within PLAN_MARGIN (as init_mesh(pp="auto") plans),
    # then across kinds the simplest within the margin of the fastest layout
    # of any kind: each kind's own fastest joins the comparison, so that the
    # margin is taken once, from the fastest predicted, not once per step.
    candidates, fastest = each_kind(PLAN_MARGIN), each_kind(0.0)
    pool = candidates + fastest
    layout, _ = simplest([(p.layout, p.prediction) for _, _, p in pool], PLAN_MARGIN)
    kind, threads, best = next(c for c in pool if c[2].layout is layout)
    return (kind, best.layout.pp, best.layout.dp, threads, best), dict(costs=(one, two), candidates=candidates)


def _run(s: dict, model: nn.Module, reps: int, quick: bool) -> dict:
    """One plan and one measurement of every layout, the choice last."""
    T, B = s["T"], s["B"]
    # the sharing of two replicas' steps, each half the batch on one thread
    measured = measure_machine(workload=functools.partial(model_step, model, nn.CrossEntropyLoss(), (T, B // 2)))
    (kind, pp, dp, threads, chosen), extra = plan(model, T, B, measured)
    one, two = extra["costs"]
    print(chosen.why, flush=True)
    lay = chosen.layout
    chosen_balance = list(lay.balance[:-1]) + [lay.balance[-1] - 1]  # the loss is no unit of the pipeline
    grid = [g for g in GRID if not quick or g[4:] == (1, 1)]
    rows = [dict(kind=k, pp=p, dp=d, threads=t, K=K, M=M, balance=None, config=_name(k, p, d, t))
            for k, p, d, t, K, M in grid]
    rows.append(dict(kind=kind, pp=pp, dp=dp, threads=threads, K=lay.chunks, M=lay.micro_batches,
                     balance=chosen_balance, config=_name(kind, pp, dp, threads), chosen="yes"))
    groups: List[Group] = []
    try:
        for r in rows:
            groups.append(Group(f"{r['config']} K={r['K']} M={r['M']}", r["pp"] * r["dp"] if r["kind"] == "parallel"
                                else 1, setup_layout, timeout=600.0, kind=r["kind"], pp=r["pp"],
                                threads=r["threads"], chunks=r["K"], micro_batches=r["M"], balance=r["balance"]))
        times, infos = take_turns(groups, reps)
        auto_i = len(rows) - 1
        fastest_i = min(range(auto_i), key=lambda i: statistics.median(times[str(i)]))
        # The grid's fastest is the least of many noisy medians, biased low;
        # the choice meets it again in fresh turns of its own.
        again, _ = take_turns([groups[auto_i], groups[fastest_i]], max(HEAD_TO_HEAD_REPS, 2 * reps))
    finally:
        close_all(groups)
    world2, world1 = machine(2, measured), machine(1, measured)
    for i, r in enumerate(rows):
        samples = times[str(i)]
        balance = list(infos[i][-1][0]["balance"])
        r.update(seconds=statistics.median(samples), spread=f"{min(samples):.4f}-{max(samples):.4f}",
                 samples=samples, balance=balance)
        layout = sim.Layout(r["dp"], r["pp"], balance[:-1] + [balance[-1] + 1], r["K"], r["M"],
                            in_process=r["kind"] == "pipeline")
        costs, cluster = (two, world1) if r["threads"] == 2 else (one, world2)
        r["predicted"] = sim.predict(costs, layout, cluster, T, B).step_s
    best = min(r["seconds"] for r in rows)
    for r in rows:
        r["vs_best"] = r["seconds"] / best
    fastest, auto = rows[fastest_i], rows[-1]
    measured_ratio = statistics.median(again["0"]) / statistics.median(again["1"])
    # The choice may be the grid's fastest layout itself: then it is the best
    # measured, and the two medians differ only by the noise between two
    # process groups running the same layout.
    same = all(auto[k] == fastest[k] for k in ("kind", "pp", "dp", "threads", "K", "M", "balance"))
    head_to_head = dict(choice=again["0"], fastest=again["1"], same_layout=same, measured_ratio=measured_ratio,
                        ratio=1.0 if same else measured_ratio)
    verdict = (f"the grid's fastest layout itself (head to head {measured_ratio:.2f}x: the noise between two groups "
               "of one layout)" if same else f"{measured_ratio:.2f}x the grid's fastest head to head")
    print(f"run: the automatic choice {auto['config']}, K={auto['K']}, M={auto['M']}: {verdict} ({fastest['config']}, "
          f"K={fastest['K']}, M={fastest['M']}; {auto['vs_best']:.2f}x in the grid)", flush=True)
    return dict(rows=rows, chosen=chosen, extra=extra, measured=measured, fastest=fastest, head_to_head=head_to_head)


def main(argv: Optional[List[str]] = None) -> List[dict]:
    """Runs the bench (see the module's docstring); returns its rows (the last run's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench layout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="timed steps per layout (median; at least 5)")
    ap.add_argument("--runs", type=int, default=3,
                    help="plans and measurements, each from scratch (the choice can differ between them)")
    ap.add_argument("--quick", action="store_true", help="3 layouts and the choice, fewer repeats allowed")
    args = report.parse_arguments(ap, argv, "--reps")
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    meta = report.metadata("layout", argv)
    s = SIZES[True]
    T, B = s["T"], s["B"]
    torch.manual_seed(0)
    model = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
    runs = [_run(s, model, args.reps, args.quick) for _ in range(args.runs)]
    last = runs[-1]
    rows, chosen, extra = last["rows"], last["chosen"], last["extra"]
    one, two = extra["costs"]
    link, allreduce, sharing, wait, handling = last["measured"]
    auto = rows[-1]
    every = [dict(choice=r["rows"][-1]["config"], K=r["rows"][-1]["K"], M=r["rows"][-1]["M"],
                  ratio=r["head_to_head"]["ratio"], grid_ratio=r["rows"][-1]["vs_best"],
                  fastest=r["fastest"]["config"], fastest_K=r["fastest"]["K"], fastest_M=r["fastest"]["M"],
                  head_to_head=r["head_to_head"]) for r in runs]
    ratios = [r["ratio"] for r in every]
    notes = [
        f"Model: {describe(s)}, the cross-entropy inside the last stage; T={T}, global batch B={B}; one "
        f"training step on 2 CPU cores; median of {args.reps} turns, every layout in turns of {STEPS_PER_TURN} "
        "steps, the last one timed. The last row is the automatic choice, run with the balance it chose; the "
        "others use the pipeline's own balance. The table is the last of "
        f"{args.runs} runs, each planned and measured from scratch.",
        "The automatic choice, run by run, against the grid's fastest in fresh turns of the two alone (median "
        f"of {max(HEAD_TO_HEAD_REPS, 2 * args.reps)} each; the grid's fastest is the least of many noisy medians, "
        "so the grid's own ratio is biased against the choice): " + "; ".join(
            f"{e['choice']}, K={e['K']}, M={e['M']}: " + (
                "the grid's fastest layout itself (the two groups of it measured "
                f"{e['head_to_head']['measured_ratio']:.2f}x apart head to head, {e['grid_ratio']:.2f}x in the grid)"
                if e["head_to_head"]["same_layout"] else
                f"{e['ratio']:.2f}x the grid's fastest ({e['fastest']}, K={e['fastest_K']}, M={e['fastest_M']}; "
                f"{e['grid_ratio']:.2f}x in the grid)") for e in every)
        + f"; within the aim of 1.10x in {sum(x <= 1.10 for x in ratios)} of {len(ratios)} runs.",
        "The last run's plan: " + "; ".join(line.strip() for line in chosen.why.splitlines())
        + ". The best predicted of the other kinds: " + "; ".join(
            f"{_name(k, p.layout.pp, p.layout.dp, t)}, K={p.layout.chunks}, M={p.layout.micro_batches}: "
            f"{p.prediction.step_s * 1e3:.1f} ms" for k, t, p in extra["candidates"] if p is not chosen) + ".",
        f"Calibration: {one} (1 thread), {two} (2 threads); gloo loopback: sends {link.latency_s * 1e6:.0f} us + "
        f"{link.bytes_per_s / 1e9:.2f} GB/s, all-reduce {allreduce.latency_s * 1e6:.0f} us + "
        f"{allreduce.bytes_per_s / 1e9:.2f} GB/s; compute sharing {sharing:.2f} (two one-thread processes "
        "running the model's step on half the batch at once, each against one alone), and in lock step "
        f"{wait:.2f} more (a barrier after each step, as replicas wait for each other); DDP's gradient handling "
        f"{handling.latency_s * 1e6:.0f} us + {handling.bytes_per_s / 1e9:.2f} GB/s.",
    ]
    same = [r for r in rows[:-1] if all(r[k] == auto[k] for k in ("kind", "pp", "dp", "threads", "K", "M"))
            and r["balance"] == auto["balance"]]
    if same:  # the choice is also a row of the grid: two measurements of one layout, the noise between turns
        notes.insert(2, f"In the last run the choice is also in the grid, measured there at "
                        f"{same[0]['seconds']:.4f} s: the difference ({same[0]['seconds'] / auto['seconds'] - 1:+.0%}) "
                        "is this machine's noise.")
    print(markdown(COLUMNS, rows))
    for n in notes[1:2]:
        print(n)
    if args.json:
        report.write_json(args.json, meta, COLUMNS, rows, notes=notes, ratio=statistics.median(ratios),
                          runs=every, plans=[dict(kind=k, threads=t, why=p.why) for k, t, p in extra["candidates"]])
    return rows
