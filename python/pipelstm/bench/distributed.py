"""python -m pipelstm.bench distributed: pp=2 over 2 processes against 1 process,
against the equal-cores baseline and against torch.distributed.pipelining,
in one run on the CPU.

The model of the pipeline benchmark (Embedding -> 4 LSTM layers -> decoder;
``--quick`` shrinks it), one training step (forward + backward, mean
cross-entropy, computed inside the last stage), gloo.

One process of one thread per stage stands in for one device per stage.
What a CPU user would run instead of 2 such processes is the same model as
one process with 2 intra-op threads (the equal-cores baseline, on
``torch.nn.LSTM`` and on ``pipelstm.LSTM``), so that is measured too.

Every configuration runs in processes of its own that stay up for the whole
run (:class:`pipelstm.bench.groups.Group`); the configurations take turns
(after a warm-up turn each) of ``STEPS_PER_TURN`` steps in a row, the last
one timed (:meth:`Group.turn`: a training loop's step follows its own
last step), and a step's time is the slowest rank's, from a barrier to
the end of its step. Reported: the median of
``--reps`` steps; each rank's busy time (its stage's spans in the engine's
trace, transfers left out) from the median step itself; and per process its
peak resident memory over the steps (``VmHWM``, reset once the model is
built) and that peak's rise above the resident memory before the first
step, next to the 1-process model's: measured by the kernel, Python and
torch's own few hundred MiB included in the peak but not in the rise.
"""

import argparse
import statistics
import sys
from typing import List, Optional

import torch
from torch import nn

from . import report
from .groups import STEPS_PER_TURN, Group, close_all, take_turns
from .pipeline import (CONFIG_COLUMNS, add_ratios, build, parse_grid_arguments, stage_busy, start_comparisons,
                       step_columns)
from .pipelining_peer import SIZES, make_data
from .table import Column, markdown
from .timing import median_index, spread

__all__ = ["setup_pipelstm", "main"]

STAGES = 2
MIB = 1 / 2**20


class _PipelstmStep:
    """This rank's stage of ``pipelstm.distributed.PipelineParallel`` and one training step of it."""

    def __init__(self, world: int, chunks: int, micro_batches: int, quick: bool, timeout: float) -> None:
        from .. import distributed as pdist

        mesh = pdist.init_mesh(pp=world, timeout=timeout)  # on the group's process group
        s = SIZES[quick]
        torch.manual_seed(0)
        model = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
        self.pipe = pdist.PipelineParallel(model, mesh, chunks=chunks, micro_batches=micro_batches,
                                           carry_state=False, threads=1, loss_fn=nn.CrossEntropyLoss())
        del model
        self.x, target = make_data(s["vocab"], s["T"], s["B"], 0)
        self.target = target.t()  # time-major here

    def step(self) -> None:
        self.pipe.zero_grad(set_to_none=True)
        self.pipe.train_step(self.x, self.target)

    def info(self) -> dict:
        core = self.pipe.core
        return dict(busy=sum(stage_busy(core.trace(), self.pipe.num_local_stages)),
                    kept=core.saved_activation_bytes)


def setup_pipelstm(rank: int, world: int, chunks: int, micro_batches: int, quick: bool,
                   mesh_timeout: float = 1800.0) -> _PipelstmStep:
    """A :class:`pipelstm.bench.groups.Group` workload: pipelstm's pipeline over ``world`` processes."""
    return _PipelstmStep(world, chunks, micro_batches, quick, mesh_timeout)


COLUMNS = CONFIG_COLUMNS + step_columns("1 process", "pipelstm pp=2") + [
    Column("busy", "busy per rank (s)", "{:.2f}"),
]
MEMORY_COLUMNS = CONFIG_COLUMNS + [
    Column("peak", "peak RSS per process (MiB)", "{:.0f}", MIB),
    Column("rise", "rise above start per process (MiB)", "{:.0f}", MIB),
    Column("rise_of_one", "largest rise / 1 process's", "{:.2f}"),
    Column("kept", "kept for backward per process, engine (MiB)", "{:.0f}", MIB),
]


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench distributed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    args, meta, model = parse_grid_arguments(ap, argv, "distributed", chunks=[4, 8])
    print(f"model: {model}; one training step; gloo; median of {args.reps} steps, all configurations in turns "
          f"of {STEPS_PER_TURN} steps, the last one timed. "
          f"One process of one thread per stage stands in for one device per stage; the equal-cores baseline "
          f"is the model as one process with {STAGES} intra-op threads.", flush=True)
    timeout = 120.0 + (60.0 if args.quick else 1800.0)
    configs = []  # (row, group)
    try:
        def add(row, world, setup, **kw):
            configs.append((row, Group(row["config"], world, setup, timeout=timeout, **kw)))

        add(dict(config="pipelstm, 1 process x 1 thread", kind="pipelstm"), 1, setup_pipelstm, chunks=1,
            micro_batches=1, quick=args.quick, mesh_timeout=timeout)
        for K in args.chunks:
            for M in args.micro_batches:
                add(dict(config=f"pipelstm, pp={STAGES}: {STAGES} processes x 1 thread", K=K, M=M,
                         kind="pipelstm"), STAGES, setup_pipelstm, chunks=K, micro_batches=M, quick=args.quick,
                    mesh_timeout=timeout)
        configs.extend(start_comparisons(args.quick, args.peer_micro_batches, timeout))
        print(f"timing {len(configs)} configurations, {args.reps} turns each after a warm-up turn "
              f"({STEPS_PER_TURN} steps a turn, the last one timed)", flush=True)
        times, logs = take_turns([g for _, g in configs], args.reps)  # logs: per turn, per rank
    finally:
        close_all([g for _, g in configs])

    rows = []
    for i, (row, _) in enumerate(configs):
        samples = times[str(i)]
        median_step = logs[i][1:][median_index(samples)]  # logs[i][0] is the warm-up
        last = logs[i][-1]
        row.update(seconds=statistics.median(samples), spread=spread(samples), samples=samples,
                   peak=[r["peak_bytes"] for r in last], rise=[r["peak_bytes"] - r["start_bytes"] for r in last])
        if row["kind"] == "pipelstm":
            row.update(busy=[r["busy"] for r in median_step], kept=[r["kept"] for r in median_step])
        rows.append(row)
    add_ratios(rows)
    for r in rows:
        r.update(rise_of_one=max(r["rise"]) / max(rows[0]["rise"][0], 1))
    memory = [{k: r.get(k) for k in ("config", "K", "M", "peak", "rise", "rise_of_one", "kept")} for r in rows]
    notes = [f"Model: {model}. One process of one thread per stage stands in for one device per stage; the "
             f"equal-cores rows are what a CPU user would run instead: the same model as one process with "
             f"{STAGES} intra-op threads.",
             f"Every step time is the median of {args.reps} steps, all configurations in turns of "
             f"{STEPS_PER_TURN} steps, the last one timed; busy times come "
             "from the median step. Memory: per process, the peak resident set over the steps (VmHWM) and its "
             "rise above the resident set before the first step, measured by the kernel; the aim for a stage is "
             "at most 1/S of the 1-process figure + 10 %."]
    tables = [dict(title="Memory per process", columns=MEMORY_COLUMNS, rows=memory)]
    print(markdown(COLUMNS, rows))
    report.print_tables(tables)
    report.write_json(args.json, meta, COLUMNS, rows, notes=notes, tables=tables)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
