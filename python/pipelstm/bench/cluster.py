"""``python -m pipelstm.bench cluster``: predicted scaling on H100 clusters, on paper.

Nothing here runs on a GPU: the simulator (``pipelstm.simulator.predict``)
plays the engine's schedule over a *model* of the units' costs on an H100
(``simulator.gpu_costs``: LSTM layers fitted to the measured layer times of
``bench gpu``'s JSON, the other units from the spec sheet) and over the
described clusters (``simulator.clusters``: links assumed from public NCCL
figures). Three tables, every assumption in the notes and the JSON:

* scaling: the automatic layout's predicted step on 1 to 32 GPUs (one
  8-GPU node, then 2 and 4 nodes), its throughput and speed-up over one
  GPU, and the seed's scheme (one LSTM layer per GPU, K = M = 1) beside it;
* pp against dp against hybrid: the best layout of every pipeline depth on
  one node, on a PCIe node and on 4 nodes;
* the models: examples/train_lm.py's (the main job) and a large LM.
"""

import argparse
import os
import sys
from typing import Dict, List, Optional

import torch
from torch import nn

from ..lstm import LSTM
from ..simulator.clusters import PRESETS, describe, h100_cluster, h100_node
from ..simulator.gpu_costs import H100_SXM, fit_lstm, gpu_costs, load_bench_rows
from ..simulator.layout import choose_layout, seed_layout
from . import report
from .table import Column, header, row_line

__all__ = ["MODELS", "main"]

GPU_JSON = ["docs/bench/gpu.json", "docs/bench/gpu_t500_16bit.json"]
# name: (vocabulary, embedding, hidden, layers, T, global batches, what it is)
MODELS = {
    "main job": (33278, 64, 256, 2, 64, [32, 256], "examples/train_lm.py's model at its defaults (emb 64, "
                 "hidden 256, 2 layers, dropout 0.1, bptt 64, batch 32) with WikiText-2's word vocabulary"),
    "large LM": (50000, 2048, 2048, 8, 128, [512], "8 LSTM layers, H = 2048, embedding 2048, V = 50,000"),
}
WORLDS = [1, 2, 4, 8, 16, 32]
SCALING = [
    Column("model", "model"), Column("B", "global B"), Column("gpus", "GPUs"), Column("layout", "automatic layout"),
    Column("step", "step ms", "{:.2f}", 1e3), Column("tokens", "k tokens/s", "{:.0f}", 1e-3),
    Column("speedup", "vs 1 GPU", "{:.2f}x"), Column("bubble", "bubble", "{:.0%}"),
    Column("peak", "peak GiB/GPU", "{:.2f}", 2.0 ** -30), Column("seed_step", "seed's scheme ms", "{:.2f}", 1e3),
    Column("vs_seed", "auto vs seed", "{:.2f}x"),
]
DEPTHS = [
    Column("model", "model"), Column("cluster", "cluster"), Column("kind", "kind"), Column("layout", "best layout"),
    Column("step", "step ms", "{:.2f}", 1e3), Column("bubble", "bubble", "{:.0%}"),
    Column("allreduce", "all-reduce ms", "{:.2f}", 1e3), Column("peak", "peak GiB/GPU", "{:.2f}", 2.0 ** -30),
    Column("vs_best", "step / best", "{:.2f}x"),
]


def _model(V: int, E: int, H: int, L: int) -> nn.Sequential:
    with torch.device("meta"):  # sizes only: nothing is allocated
        return nn.Sequential(nn.Embedding(V, E), LSTM(E, H, num_layers=L, dropout=0.1), nn.Dropout(0.1),
                             nn.Linear(H, V))


def _name(layout) -> str:
    kind = "dp" if layout.pp == 1 else ("pp" if layout.dp == 1 else "hybrid")
    ck = "" if layout.checkpoint == "never" else f", recompute {layout.checkpoint}"
    return f"{kind} {layout.dp}x{layout.pp}, K={layout.chunks}, M={layout.micro_batches}{ck}"


def _cluster_of(world: int):
    return h100_node(world) if world <= 8 else h100_cluster(world // 8)


def scaling_rows(name: str, costs, T: int, B: int, worlds: List[int]) -> List[dict]:
    """One row per world size: the automatic layout and the seed's scheme."""
    from ..simulator import predict

    rows, base = [], None
    lstm_layers = sum(u.kind == "lstm" for u in costs.units())
    for world in worlds:
        cluster = _cluster_of(world)
        plan = choose_layout(costs, cluster, T, B)
        p = plan.prediction
        base = base or p.step_s  # the first world: one GPU
        row = dict(model=name, B=B, gpus=world, layout=_name(plan.layout), step=p.step_s, tokens=T * B / p.step_s,
                   speedup=base / p.step_s, bubble=p.bubble, peak=max(p.stage_peak_bytes),
                   balance=list(plan.layout.balance), why=plan.why)
        if world % lstm_layers == 0 and B % (world // lstm_layers) == 0:
            seed = predict(costs, seed_layout(costs, world), cluster, T, B)
            row.update(seed_step=seed.step_s, vs_seed=seed.step_s / p.step_s, seed_bubble=seed.bubble)
        rows.append(row)
    return rows


def depth_rows(name: str, costs, T: int, B: int, clusters: Dict[str, object]) -> List[dict]:
    """The best layout of every pipeline depth on each cluster."""
    rows = []
    units = len(costs.units()) - 1
    for cname, cluster in clusters.items():
        world = cluster.world_size
        found = []
        for pp in [p for p in range(1, world + 1) if world % p == 0 and p <= units and B % (world // p) == 0]:
            plan = choose_layout(costs, cluster, T, B, pp=pp)
            found.append(plan)
        best = min(p.prediction.step_s for p in found)
        for plan in found:
            p, lay = plan.prediction, plan.layout
            rows.append(dict(model=name, cluster=cname, kind=_name(lay).split()[0], layout=_name(lay), step=p.step_s,
                             bubble=p.bubble, allreduce=p.allreduce_s, peak=max(p.stage_peak_bytes),
                             vs_best=p.step_s / best, balance=list(lay.balance)))
    return rows


def main(argv: Optional[List[str]] = None) -> List[dict]:
    """Runs the bench (see the module's docstring); returns the scaling rows."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-json", nargs="+", default=GPU_JSON,
                    help="bench gpu results the LSTM layers' costs are fitted to (one device); default: the "
                         "repository's, relative to the current directory (run from the repository's root)")
    ap.add_argument("--setting", choices=("fp32", "bf16", "fp16"), default="bf16")
    ap.add_argument("--quick", action="store_true", help="the main job only, up to 8 GPUs")
    report.add_arguments(ap)
    args = ap.parse_args(argv)
    missing = [p for p in args.gpu_json if not os.path.exists(p)]
    if missing:
        ap.error(f"--gpu-json: {', '.join(missing)} not found (bench gpu's JSON results)")
    meta = report.metadata("cluster", argv)
    fit = fit_lstm(load_bench_rows(args.gpu_json), args.setting)
    models = {k: v for k, v in MODELS.items() if not args.quick or k == "main job"}
    worlds = [w for w in WORLDS if not args.quick or w <= 8]
    scaling, depths, described, costs = [], [], {}, None
    for name, (V, E, H, L, T, batches, what) in models.items():
        costs = gpu_costs(_model(V, E, H, L), fit, args.setting, loss_vocab=V)
        described[name] = dict(what=what, V=V, E=E, H=H, layers=L, T=T, batches=batches,
                               params=sum(u.param_bytes for u in costs.units()) // costs.elt)
        for B in batches:
            scaling += scaling_rows(name, costs, T, B, worlds)
        clusters = {"1 node, NVLink": h100_node(), "1 node, PCIe": PRESETS["pcie8"][0]()}
        if not args.quick:
            clusters["4 nodes, IB"] = h100_cluster(4)
        depths += depth_rows(name, costs, T, max(batches), clusters)
    print(header(SCALING))
    for r in scaling:
        print(row_line(SCALING, r))
    print(header(DEPTHS))
    for r in depths:
        print(row_line(DEPTHS, r))
    notes = _notes(fit, models)
    for n in notes:
        print(n)
    if args.json:
        costs_note = costs.describe()
        report.write_json(args.json, meta, SCALING, scaling, notes=notes,
                          tables=[dict(title="pp against dp against hybrid (the best K, M of each depth)",
                                       columns=DEPTHS, rows=depths)],
                          device=f"{H100_SXM.name} (a model: predicted, not measured)",
                          clusters={k: dict(describe(b()), assumptions=a) for k, (b, a) in PRESETS.items()},
                          cost_model=costs_note, models=described)
    return scaling


def _notes(fit, models) -> List[str]:
    f = fit
    return [
        "Predicted by pipelstm's simulator, not measured: no H100 cluster was used. One training step (forward, "
        f"backward, the data-parallel all-reduce, no optimizer step), all in {f.setting}; B is the global batch, "
        "split over the dp replicas; 'vs 1 GPU' is the speed-up over the same model on one GPU.",
        "Models: " + "; ".join(f"{k}: {v[6]}, T = {v[4]}" for k, v in models.items()) + ".",
        f"LSTM layers: fitted to pipelstm's measured layer times ({f.points} points on {f.measured_on}, T in "
        f"{f.T_range}, B in {f.B_range}, H in {f.H_range}; max error {f.max_rel_error:.1%}, rms "
        f"{f.rms_rel_error:.1%}); H = 2048 is an extrapolation by FLOPs (the GEMM and weight-read terms grow with "
        "H(I+H), the per-step latency does not). The H200's times stand for the H100's (same GH100 die), with the "
        "memory-bound terms slowed by the HBM ratio 4.8 / 3.35 TB/s. The per-call cost the fit finds is paid by "
        "every item (forward half, backward half).",
        f"Embedding, Linear, Dropout, loss: the H100 SXM spec sheet ({H100_SXM.flops[f.setting] / 1e12:.0f} TFLOP/s "
        f"dense {f.setting}, {H100_SXM.hbm_bytes_per_s / 1e12:.2f} TB/s) at {H100_SXM.gemm_efficiency:.0%} of the "
        f"FLOP rate and {H100_SXM.memory_efficiency:.0%} of the bandwidth, plus {H100_SXM.launch_s * 1e6:.0f} µs "
        "a kernel.",
        "Links: " + "; ".join(f"{k}: {a}" for k, (_, a) in PRESETS.items()) + ". A ring all-reduce over the "
        "slowest link of the ring, after each stage's backward (DDP's hooks fire when the pipelined backward "
        "returns); 1 to 8 GPUs are one node, 16 and 32 are 2 and 4 nodes.",
        "Memory: parameters, their gradients and the activations kept for the backward; the optimizer's state "
        "(e.g. Adam's two moments) comes on top. The automatic layout recomputes only where 80 GB would not hold.",
        "The seed's scheme: one LSTM layer per GPU (the embedding with the first, the decoder and loss with the "
        "last), no time chunks and one micro-batch (K = M = 1), the rest of the GPUs as data-parallel replicas.",
    ]
