"""python -m pipelstm.bench simulator: the simulator's predictions against measured steps.

The model of the pipeline benchmark's quick size (Embedding(1000, 128) ->
4 x LSTM(H=256) -> Linear(256, 1000), T=64, global batch B=16, mean
cross-entropy inside the last stage), one training step, on the CPU, one
thread per stage:

* ``pipelstm.Pipeline`` in one process with 1 and 2 stages at several K x M;
* ``PipelineParallel`` over gloo, one process per stage (as torchrun
  starts them; here :class:`pipelstm.bench.groups.Group`), pp in {1, 2}
  x dp in {1, 2} on this machine's 2 cores.

First the units are calibrated in this process
(``pipelstm.simulator.calibrate``, one thread, at every item size the
configurations run, JSON beside the results with ``--json``), and the
loopback gloo link between two processes is measured (a ping-pong of
small and large messages: its latency and bytes per second). Then every
configuration runs in processes of its own that take turns
(``STEPS_PER_TURN`` steps a turn, the last timed; the median of
``--reps``), and ``pipelstm.simulator.predict`` predicts it.

Memory, per process (one process holds every stage of an in-process
pipeline; one stage per process over gloo): each configuration runs again
in fresh processes with the buffer cache off (``PIPELSTM_BUFFER_CACHE_MB=0``)
and every allocation of 64 KiB and more mapped on its own
(``MALLOC_MMAP_THRESHOLD_=65536``), so that freed memory leaves the
resident set at once; the figure is the rise of the resident set's peak
(``VmHWM``) over the resident set just before the step, the gradients of
the step before set to None: the largest memory the step held on top of
the parameters, measured by the kernel, in the third step (a steady one:
DDP rebuilds its gradient buckets in the second). Predicted: the stages' peak less
their parameters.
"""

import argparse
import functools
import os
import statistics
import sys
from typing import List, Optional

import torch
from torch import nn

from .. import simulator as sim
from ..simulator.calibrate import model_step
from ..simulator.clusters import measure_machine
from . import report
from .groups import STEPS_PER_TURN, Group, close_all, take_turns
from .pipeline import CONFIG_COLUMNS, build, describe, setup_pipeline
from .pipelining_peer import SIZES
from .simulator_runs import (MEMORY_ENV, gloo_links, setup_calibration, setup_link_probe, setup_memory,
                             setup_parallel)
from .table import Column, markdown
from .timing import median_index

__all__ = ["main"]

MIB = 1 / 2**20
# Steps of a memory run, the last measured: a training loop's steady step.
# DDP rebuilds its gradient buckets in its second step, freeing the first
# step's while that step runs, so the second step's rise is too low.
MEMORY_STEPS = 3
IN_PROCESS = [(1, 1, 1), (1, 4, 2), (2, 1, 1), (2, 4, 1), (2, 4, 2), (2, 8, 2)]  # (stages, K, M)
OVER_GLOO = [(1, 1, 1, 1), (2, 1, 4, 2), (2, 1, 8, 2), (1, 2, 4, 1)]  # (pp, dp, K, M)


def _configs() -> List[dict]:
    rows = [dict(config=f"Pipeline, {S} stage{'s' if S > 1 else ''} x 1 thread, 1 process", kind="pipeline", pp=S,
                 dp=1, K=K, M=M) for S, K, M in IN_PROCESS]
    rows += [dict(config=f"PipelineParallel pp={pp} dp={dp}, {pp * dp} process{'es' if pp * dp > 1 else ''} x 1 "
                         "thread (gloo)", kind="parallel", pp=pp, dp=dp, K=K, M=M) for pp, dp, K, M in OVER_GLOO]
    return rows


def _group(row: dict, name: str, memory: bool) -> Group:
    kw = (dict(stages=row["pp"], chunks=row["K"], micro_batches=row["M"]) if row["kind"] == "pipeline"
          else dict(pp=row["pp"], chunks=row["K"], micro_batches=row["M"]))
    world = 1 if row["kind"] == "pipeline" else row["pp"] * row["dp"]
    if memory:
        return Group(name, world, setup_memory, timeout=600.0, kind=row["kind"], **kw)
    if row["kind"] == "pipeline":
        return Group(name, world, setup_pipeline, timeout=600.0, quick=True, loss_outside=False, **kw)
    return Group(name, world, setup_parallel, timeout=600.0, **kw)


def _item_sizes(s: dict, rows: List[dict]) -> List[tuple]:
    sizes = set()
    for row in rows:
        K, M, t_sizes, b_sizes = sim.schedule.item_grid(s["T"], s["B"] // row["dp"], row["K"], row["M"])
        sizes.update((t, b) for t in t_sizes for b in b_sizes)
        sizes.add((s["T"], s["B"] // row["dp"]))  # the weight tasks: the whole pass
    return sorted(sizes)


COLUMNS = CONFIG_COLUMNS + [
    Column("seconds", "measured step (s), median", "{:.3f}"), Column("spread", "min-max (s)"),
    Column("predicted", "predicted step (s)", "{:.3f}"), Column("error", "error", "{:+.1%}"),
    Column("bubble", "predicted bubble", "{:.3f}"),
    Column("busy_ratio", "compute, measured / predicted", "{:.2f}"),
    Column("at_measured", "predicted at the measured compute (s)", "{:.3f}"),
    Column("schedule_error", "error", "{:+.1%}"),
]
MEMORY_COLUMNS = CONFIG_COLUMNS + [
    Column("rise", "measured peak over the parameters, per process (MiB)", "{:.1f}", MIB),
    Column("predicted_rise", "predicted (MiB)", "{:.1f}", MIB), Column("memory_error", "error", "{:+.1%}"),
    Column("kept", "kept for backward, engine (MiB)", "{:.1f}", MIB),
]


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench simulator", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="timed steps per configuration (median; at least 5)")
    ap.add_argument("--calibration", default=None, help="also save the calibration here (JSON)")
    ap.add_argument("--device", default="cpu",
                    help="cpu (default: every configuration above), or cuda: one and two stages on one GPU "
                         "(bench/simulator_device.py)")
    args = report.parse_arguments(ap, argv, "--reps")
    meta = report.metadata("simulator", argv)
    s = SIZES[True]
    if torch.device(args.device).type != "cpu":
        return _on_device(ap, args, meta, s)
    model_text = f"{describe(s)}; T={s['T']}, global batch B={s['B']}"
    load_before = os.getloadavg()
    torch.manual_seed(0)
    model = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
    # how much two processes running the model's step (half the batch each) slow each other
    measured = measure_machine(workload=functools.partial(model_step, model, nn.CrossEntropyLoss(),
                                                          (s["T"], s["B"] // 2)))
    sharing, wait, handling = measured.compute_sharing, measured.replica_wait, measured.gradient_handling
    rows = _configs()
    groups: List[Group] = []
    try:  # the calibration and the link probe take turns with the configurations
        groups = [Group("calibration", 1, setup_calibration, timeout=600.0, sizes=_item_sizes(s, _configs())),
                  Group("gloo link", 2, setup_link_probe, timeout=600.0)]
        groups += [_group(r, f"{r['config']} K={r['K']} M={r['M']}", memory=False) for r in rows]
        times, infos = take_turns(groups, args.reps)
    finally:
        close_all(groups)
    costs = sim.FittedCosts.from_dict(infos[0][-1][0]["costs"])
    if args.calibration:
        costs.save(args.calibration)
    gloo, allreduce = gloo_links(infos[1])
    gloo_text = (f"gloo between 2 processes: sends {gloo.latency_s * 1e6:.0f} us + {gloo.bytes_per_s / 1e9:.2f} GB/s, "
                 f"all-reduce {allreduce.latency_s * 1e6:.0f} us + {allreduce.bytes_per_s / 1e9:.2f} GB/s; compute "
                 f"sharing {sharing:.2f}, replicas in lock step {wait:.2f} more; DDP's gradient handling "
                 f"{handling.latency_s * 1e6:.0f} us + {handling.bytes_per_s / 1e9:.2f} GB/s")
    print(f"calibration: {costs}; {gloo_text}", flush=True)
    times = {str(i): times[str(i + 2)] for i in range(len(rows))}
    infos = infos[2:]
    _measure_memory(rows)

    load_after = os.getloadavg()
    free = sim.Link(0.0, float("inf"))
    cpu_memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    n_units = len(costs.units())
    for i, r in enumerate(rows):
        samples = times[str(i)]
        r.update(seconds=statistics.median(samples), spread=f"{min(samples):.3f}-{max(samples):.3f}",
                 samples=samples)
        last = infos[i][-1]
        median_step = infos[i][1:][median_index(samples)]  # infos[i][0]: the warm-up turn's
        busy = sum(sum(rank["busy"]) for rank in median_step)
        balance = list(last[0]["balance"]) if r["pp"] > 1 else [n_units - 1]
        balance[-1] += 1  # the loss, in the last stage
        inner = r["kind"] == "pipeline"
        link = free if inner else gloo
        cluster = sim.Cluster(1, 2, "cpu", cpu_memory / 2, free, link, link, allreduce=allreduce,
                              compute_sharing=sharing, replica_wait=wait, gradient_handling=handling)
        layout = sim.Layout(r["dp"], r["pp"], balance, r["K"], r["M"], in_process=inner)
        p = sim.predict(costs, layout, cluster, s["T"], s["B"])
        params = [sum(costs.units()[u].param_bytes for u in range(sum(balance[:j]), sum(balance[: j + 1])))
                  for j in range(r["pp"])]
        # resident before the step: the parameters and, with dp > 1, DDP's buckets
        before = [prm * (2 if r["dp"] > 1 else 1) for prm in params]
        if inner:
            predicted_rise = [p.process_peak_bytes[0] - sum(before)]
        else:  # rank dp_rank * pp + pp_rank holds stage pp_rank
            predicted_rise = [p.process_peak_bytes[rank % r["pp"]] - before[rank % r["pp"]]
                              for rank in range(len(r["rise"]))]
        predicted_busy = sum(e["end_ns"] - e["start_ns"] for e in p.events if e["phase"] != "transfer") / 1e9
        ratio = busy / (predicted_busy * r["dp"])
        at_measured = sim.predict(costs.scaled(ratio), layout, cluster, s["T"], s["B"]).step_s
        r.update(busy_ratio=ratio, at_measured=at_measured, schedule_error=at_measured / r["seconds"] - 1,
                 predicted=p.step_s, error=p.step_s / r["seconds"] - 1, bubble=p.bubble, balance=balance,
                 predicted_rise=predicted_rise, kept=[info["kept"] for info in last],
                 memory_error=max((pr / m - 1 for pr, m in zip(predicted_rise, r["rise"])), key=abs),
                 allreduce=p.allreduce_s)
    worst = max(rows, key=lambda r: abs(r["error"]))
    worst_schedule = max(rows, key=lambda r: abs(r["schedule_error"]))
    worst_mem = max(rows, key=lambda r: abs(r["memory_error"]))
    notes = [f"Model: {model_text}; one training step; CPU, one thread per stage; median of {args.reps} steps, all "
             f"configurations in turns of {STEPS_PER_TURN} steps, the last one timed.",
             f"Calibration: {costs}, in rounds taking turns with the configurations; {gloo_text} (a ping-pong "
             "and all-reduces of 8 B to 9 MiB, taking turns too).",
             f"Load average of the machine (1, 5, 15 min) before the run: "
             f"{', '.join(f'{x:.1f}' for x in load_before)}; after the timed turns: "
             f"{', '.join(f'{x:.1f}' for x in load_after)} ({os.cpu_count()} cores; a load above the "
             "configurations' own processes is other work sharing the cores).",
             "compute, measured / predicted: the seconds the stages computed in the median step (the engine's "
             "trace, all ranks) over the predicted ones: above 1 where the units ran slower than calibrated "
             "(other work on the cores). Predicted at the measured compute: the same prediction with every unit's "
             "seconds scaled by that ratio, which leaves the schedule, the links and the overheads to the simulator.",
             f"Worst step: {worst['config']} K={worst['K']} M={worst['M']}, {worst['error']:+.1%} (at the measured "
             f"compute: {worst_schedule['config']} K={worst_schedule['K']} M={worst_schedule['M']}, "
             f"{worst_schedule['schedule_error']:+.1%}). Worst memory: "
             f"{worst_mem['config']} K={worst_mem['K']} M={worst_mem['M']}, {worst_mem['memory_error']:+.1%}.",
             "Memory per process " + __doc__.split(
                 "Memory, per process")[1].split("their parameters.")[0].strip().replace("\n", " ")
             + " their parameters."]
    memory = [{k: r.get(k) for k in ("config", "K", "M", "rise", "predicted_rise", "memory_error", "kept")}
              for r in rows]
    tables = [dict(title="Memory per process", columns=MEMORY_COLUMNS, rows=memory)]
    print(markdown(COLUMNS, rows))
    report.print_tables(tables)
    for n in notes[2:5]:
        print(n)
    report.write_json(args.json, meta, COLUMNS, rows, notes=notes, tables=tables)
    return rows


def _measure_memory(rows: List[dict]) -> None:
    """Each configuration's rise of memory per process (``rise``), in fresh
    processes, one configuration at a time."""
    groups = []
    try:
        for r in rows:
            env = {k: os.environ.get(k) for k in MEMORY_ENV}
            os.environ.update(MEMORY_ENV)
            try:
                g = _group(r, f"memory of {r['config']}", memory=True)
            finally:
                for k, v in env.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            groups.append(g)
            g.turn(MEMORY_STEPS)
            r["rise"] = [info["rise"] for info in g.last]
            g.close()
    finally:
        close_all(groups)


def _on_device(ap: argparse.ArgumentParser, args: argparse.Namespace, meta: dict, s: dict) -> List[dict]:
    """``--device cuda``: the one-device configurations of ``simulator_device``."""
    if torch.device(args.device).type != "cuda" or not torch.cuda.is_available():
        ap.error(f"--device {args.device}: expected cpu, or cuda on a machine with a GPU (torch.cuda.is_available() "
                 f"is {torch.cuda.is_available()})")
    from . import simulator_device

    rows = [dict(dp=1, K=K, M=M) for _, K, M in simulator_device.CONFIGS]
    out = simulator_device.run(args.device, args.reps, _item_sizes(s, rows))
    if args.calibration:
        out["costs"].save(args.calibration)
    meta["device"] = dict(name=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    report.write_json(args.json, meta, simulator_device.COLUMNS, out["rows"], notes=out["notes"])
    return out["rows"]


if __name__ == "__main__":
    main(sys.argv[1:])
