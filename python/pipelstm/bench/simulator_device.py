"""``python -m pipelstm.bench simulator --device cuda``: the simulator against
pipeline stages on one GPU.

The CPU bench's model as ``pipelstm.Pipeline`` on one device: one stage,
and two stages on the same device (each stage launches on a stream of its
own, so their items may run at once), at several K x M, in one process: the
configurations and the calibration's rounds take turns (each configuration
runs two steps a turn, the second timed, from a synchronised start to a
synchronised end). The calibration runs the units on the device
(``Calibrator(device=...)``): a unit's time is its kernels' where they take
longer than its launches. The prediction plays the stages as devices of one
node joined by the same-GPU link (``clusters.SAME_GPU``, a device-to-device
copy) that compute independently (compute sharing 1.0: this model's kernels
are far from filling the device), the assumption the measurement tests.

Memory: the peak of torch's allocator over a step, over what was allocated
before it (the parameters, the input; the gradients of the step before set
to None), against the predicted peak of the process less its parameters.
On the CPU (a check that the bench runs: ``run(device="cpu")``) memory is
not measured.
"""

import statistics
import time
from typing import List

import torch
from torch import nn

from .. import Pipeline
from .. import simulator as sim
from ..simulator.clusters import SAME_GPU
from .memory import device_peak_bytes
from .pipeline import CONFIG_COLUMNS, PipelineStep, build
from .pipelining_peer import SIZES, make_data
from .table import Column, markdown
from .timing import interleaved_times

__all__ = ["CONFIGS", "COLUMNS", "run"]

MIB = 1 / 2**20
CONFIGS = [(1, 1, 1), (1, 4, 2), (2, 1, 1), (2, 4, 1), (2, 4, 2), (2, 8, 2)]  # (stages, K, M)
COLUMNS = CONFIG_COLUMNS + [
    Column("seconds", "measured step (s), median", "{:.4f}"), Column("spread", "min-max (s)"),
    Column("predicted", "predicted step (s)", "{:.4f}"), Column("error", "error", "{:+.1%}"),
    Column("bubble", "predicted bubble", "{:.3f}"),
    Column("rise", "measured peak over the parameters (MiB)", "{:.1f}", MIB),
    Column("predicted_rise", "predicted (MiB)", "{:.1f}", MIB), Column("memory_error", "error", "{:+.1%}"),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pipelines(device: torch.device, s: dict, x, target) -> List[dict]:
    rows = []
    for S, K, M in CONFIGS:
        torch.manual_seed(0)
        pipe = Pipeline(build(s["vocab"], s["emb"], s["hidden"], s["layers"]), devices=[str(device)] * S, chunks=K,
                        micro_batches=M, loss_fn=nn.CrossEntropyLoss())
        where = "one stage" if S == 1 else f"{S} stages on one device"
        rows.append(dict(config=f"Pipeline, {where} ({device})", kind="pipeline", pp=S, dp=1, K=K, M=M,
                         pipe=pipe, step=PipelineStep(pipe, x, target)))
    return rows


def _second_of_two(step, device: torch.device):
    """A function that runs ``step`` twice and returns the seconds of the
    second, from a synchronised start to a synchronised end (a training
    loop runs one layout step after step)."""
    def run() -> float:
        step()
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        return time.perf_counter() - start
    return run


def _rise(row: dict, device: torch.device) -> int:
    """The allocator's peak over one step, over what was allocated before it."""
    row["pipe"].zero_grad(set_to_none=True)
    return device_peak_bytes(row["step"], device)


def run(device: str, reps: int, item_sizes) -> dict:
    """Calibrates, measures and predicts every configuration on ``device``.

    Returns:
        ``dict(rows=..., costs=..., notes=...)``; a row has the measured step
        (median of ``reps``), the prediction and its error, and on CUDA the
        memory rise, its prediction and error.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    s = SIZES[True]
    torch.manual_seed(0)
    calibrator = sim.Calibrator(build(s["vocab"], s["emb"], s["hidden"], s["layers"]),
                                loss_fn=nn.CrossEntropyLoss(), device=str(dev), sizes=item_sizes)
    x, target = make_data(s["vocab"], s["T"], s["B"], seed=0)
    x, target = x.to(dev), target.to(dev)
    rows = _pipelines(dev, s, x, target)
    # The first turn warms up (and captures where the library graphs).
    fns = {"calibration": calibrator.round, **{i: _second_of_two(r["step"], dev) for i, r in enumerate(rows)}}
    times = interleaved_times(fns, reps, warmup=1, device=str(dev))
    costs = calibrator.costs()
    memory = float(torch.cuda.get_device_properties(dev).total_memory) if dev.type == "cuda" else 64e9
    cluster = sim.Cluster(1, 2, str(dev), memory, SAME_GPU, SAME_GPU, SAME_GPU)
    n_units = len(costs.units())
    for i, r in enumerate(rows):
        samples = times[i]
        r.update(seconds=statistics.median(samples), spread=f"{min(samples):.4f}-{max(samples):.4f}",
                 samples=samples)
        balance = list(r["pipe"].balance) if r["pp"] > 1 else [n_units - 1]
        balance[-1] += 1  # the loss, in the last stage
        p = sim.predict(costs, sim.Layout(1, r["pp"], balance, r["K"], r["M"], in_process=True), cluster,
                        s["T"], s["B"])
        r.update(predicted=p.step_s, error=p.step_s / r["seconds"] - 1, bubble=p.bubble, balance=balance)
        if dev.type == "cuda":
            params = sum(u.param_bytes for u in costs.units())
            r.update(rise=_rise(r, dev), predicted_rise=p.process_peak_bytes[0] - params)
            r["memory_error"] = r["predicted_rise"] / r["rise"] - 1
        del r["pipe"], r["step"]
    worst = max(rows, key=lambda r: abs(r["error"]))
    notes = [f"Model: Embedding({s['vocab']}, {s['emb']}) -> {s['layers']} x LSTM(H={s['hidden']}) -> "
             f"Linear({s['hidden']}, {s['vocab']}); T={s['T']}, B={s['B']}; one training step on {dev}; median of "
             f"{reps} steps, the configurations and the calibration's rounds taking turns.",
             f"Calibration: {costs}. Prediction: the stages as devices of one node joined by a same-GPU copy "
             f"({SAME_GPU.latency_s * 1e6:.0f} us + {SAME_GPU.bytes_per_s / 1e12:.1f} TB/s), computing independently "
             "(compute sharing 1.0).",
             f"Worst step: {worst['config']} K={worst['K']} M={worst['M']}, {worst['error']:+.1%}."]
    if dev.type == "cuda":
        worst_mem = max(rows, key=lambda r: abs(r["memory_error"]))
        notes.append(f"Worst memory: {worst_mem['config']} K={worst_mem['K']} M={worst_mem['M']}, "
                     f"{worst_mem['memory_error']:+.1%} (the allocator's peak over the step, over what was "
                     "allocated before it, against the predicted peak less the parameters).")
    print(markdown(COLUMNS, rows))
    for n in notes:
        print(n)
    return dict(rows=rows, costs=costs, notes=notes)
