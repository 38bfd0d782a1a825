"""``python -m pipelstm.bench gpu``: pipelstm.LSTM against nn.LSTM (cuDNN) over a GPU grid.

The grid a GPU user would ask for: B in {1, 8, 32, 128, 512}, H in {256,
512, 1024} (I = H), T in {100, 500}, 1 and 4 layers, forward + backward of
the output's sum (training mode, the input requiring grad), time-major. Each
size runs in every setting:

* ``fp32``: both modules fp32, TF32 off on both sides
  (``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32``);
* ``default``: both modules fp32 in torch's default settings, as a user
  gets them (``cudnn.allow_tf32`` on: cuDNN uses TF32, and so do
  pipelstm's LSTM GEMMs, which follow the same switch);
* ``bf16``, ``fp16``: both modules in that dtype (cuDNN in the same dtype;
  a row says so where cuDNN refuses it).

Both modules hold the same weights (``load_state_dict``) and are timed
alternately in one process, each run from a synchronised start to a
synchronised end; a row gives the medians of ``--repeats`` runs, the ratio
cuDNN / pipelstm (> 1: pipelstm faster), and pipelstm's time over its floor
(``bench floors``: the largest of the FLOP, memory and launch floors at this
dtype, H100 defaults). A row whose warm-up run took longer than
``--row-seconds`` is skipped and listed. The summary gives, per setting, the
geometric mean and the worst ratio, and the time of 4 layers over 1 layer
at B <= 32 (the layer wavefront: at most 2x is the aim). ``--device cpu
--quick`` checks that the bench runs on a machine without a GPU.

Host time: after the timed runs, each side's median over ``--repeats``
runs of the time its call takes to return, from a synchronised start and
not waiting for the GPU: what the host spends launching the step. Where
it is under the step's time the GPU, not the host, bounds the step; the
summary gives pipelstm's largest host time / step time at B <= 32.

Memory: after the timed runs, one more step of each side with torch's
allocator peak reset; a row gives that peak over what was allocated before
the step (weights, input, the last step's gradients), plus, for pipelstm,
the device memory its CUDA graphs came to hold during the row (the layer
ops' for pipelstm, the stacks' for a variant; graphs a row drops from the
cache make this an underestimate), and the ratio pipelstm / cuDNN (< 1:
pipelstm holds less).

``--variant persistent=1`` (any of ``pipelstm.backends.cuda``'s switches,
``layer_wavefront=8`` say) times a third side in the same alternation:
pipelstm with those switches set for its calls. A row then also gives its
time and the gain, pipelstm's time over the variant's (> 1: the variant is
faster): the measurements a dispatch rule is made from.
"""

import itertools
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch
from torch import nn

from .. import _C
from ..stack import graph as stack_graph
from ..backends import cuda as cuda_switches
from ..backends._switch import Switch
from ..lstm import LSTM
from . import report
from .floors import floors
from .memory import device_peak_bytes
from .table import Column, add_row, header
from .timing import interleaved_times, medians

__all__ = ["SETTINGS", "GRID", "main"]

SETTINGS = ("fp32", "default", "bf16", "fp16")
GRID = dict(B=[1, 8, 32, 128, 512], H=[256, 512, 1024], T=[100, 500], layers=[1, 4])
QUICK_GRID = dict(B=[2], H=[16], T=[6], layers=[1, 4])
DTYPES = {"fp32": torch.float32, "default": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# bench floors' H100 defaults: fp32 without tensor cores, bf16/fp16 dense
# matrix work, memory bandwidth, one launch on the critical path.
RATES = {"fp32": 50e12, "default": 50e12, "bf16": 790e12, "fp16": 790e12}
BANDWIDTH, STEP_LATENCY = 3.0e12, 3e-6
# Run-time switches of pipelstm's CUDA path, recorded with the results.
SWITCHES = ("PIPELSTM_CUDA_GRAPHS", "PIPELSTM_PERSISTENT", "PIPELSTM_PERSISTENT_KERNEL", "PIPELSTM_LAYER_WAVEFRONT",
            "PIPELSTM_STACK_GRAPH")

COLUMNS = [
    Column("setting", "setting"), Column("layers", "layers"), Column("T", "T"), Column("B", "B"),
    Column("H", "I=H"), Column("ours", "pipelstm ms", "{:.2f}", 1e3), Column("peer", "nn.LSTM (cuDNN) ms", "{:.2f}", 1e3),
    Column("ratio", "nn.LSTM / pipelstm", "{:.2f}x"), Column("floor", "floor ms", "{:.3f}", 1e3),
    Column("of_floor", "pipelstm / floor", "{:.1f}x"),
    Column("ours_memory", "pipelstm peak MiB", "{:.0f}", 2.0 ** -20),
    Column("peer_memory", "cuDNN peak MiB", "{:.0f}", 2.0 ** -20),
    Column("memory_ratio", "memory pipelstm / cuDNN", "{:.2f}x"),
    Column("ours_host", "pipelstm host ms", "{:.2f}", 1e3), Column("peer_host", "cuDNN host ms", "{:.2f}", 1e3),
    Column("host_of_step", "pipelstm host / step", "{:.2f}x"), Column("note", "note"),
]
VARIANT_COLUMNS = [Column("variant", "variant ms", "{:.2f}", 1e3),
                   Column("variant_gain", "pipelstm / variant", "{:.2f}x"),
                   Column("variant_memory", "variant peak MiB", "{:.0f}", 2.0 ** -20)]
SUMMARY_COLUMNS = [
    Column("setting", "setting"), Column("rows", "rows"), Column("geomean", "geometric mean", "{:.2f}x"),
    Column("worst", "worst", "{:.2f}x"), Column("worst_row", "worst row"), Column("at_least_1", "rows >= 1.0x"),
    Column("stack", "4 layers / 1 layer, B <= 32 (ours, max)", "{:.2f}x"),
    Column("memory", "memory pipelstm / cuDNN, max", "{:.2f}x"),
    Column("host", "pipelstm host / step, B <= 32, max", "{:.2f}x"),
    Column("skipped", "skipped rows"),
]


class Settings:
    """Applies one setting's TF32 flags for the block it guards (``default``
    leaves torch's own), and puts the previous ones back."""

    def __init__(self, setting: str) -> None:
        self.setting = setting

    def __enter__(self) -> None:
        self.saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        if self.setting != "default":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc) -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def models(setting: str, layers: int, T: int, B: int, H: int, device: str):
    """``(nn.LSTM, pipelstm.LSTM, x)`` of one row: the same weights, in the
    setting's dtype, and a time-major input that requires grad."""
    dtype = DTYPES[setting]
    torch.manual_seed(0)
    peer = nn.LSTM(H, H, num_layers=layers).to(device, dtype)
    ours = LSTM(H, H, num_layers=layers).to(device, dtype)
    ours.load_state_dict(peer.state_dict())
    return peer, ours, torch.randn(T, B, H, device=device, dtype=dtype, requires_grad=True)


def training_step(model: nn.Module, x: torch.Tensor):
    """One timed step, forward and backward of the output's sum, as a callable."""
    def run() -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x)[0].float().sum().backward()
    return run


def _with_switches(run, switches: Dict[str, object]):
    def switched() -> None:
        with cuda_switches.flags(**switches):
            run()
    return switched


def parse_variant(items: List[str]) -> Dict[str, object]:
    """``["persistent=1", "layer_wavefront=8"]`` as ``flags`` arguments,
    each value read as its switch's environment variable is."""
    switches = {k: v for k, v in vars(type(cuda_switches)).items() if isinstance(v, Switch)}
    out: Dict[str, object] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in switches:
            raise ValueError(f"--variant: expected SWITCH=VALUE with SWITCH one of {', '.join(switches)}, "
                             f"got {item!r}")
        out[name] = switches[name].kind.to_python(value)
    return out


def measure(setting: str, layers: int, T: int, B: int, H: int, repeats: int, device: str,
            row_seconds: float, variant: Optional[Dict[str, object]] = None) -> dict:
    """One row: both sides (and the variant) timed alternately, or the reason
    they were not."""
    dtype = DTYPES[setting]
    row = dict(setting=setting, layers=layers, T=T, B=B, H=H, ours=None, peer=None, ratio=None, note=None)
    f = floors(T, B, H, H, layers, torch.finfo(dtype).bits // 8, RATES[setting], BANDWIDTH, STEP_LATENCY)
    row["floor"] = max(f["t_flop"], f["t_mem"], f["t_lat"])
    peer, ours, x = models(setting, layers, T, B, H, device)
    sides = {"ours": training_step(ours, x), "peer": training_step(peer, x)}
    if variant:
        sides["variant"] = _with_switches(training_step(ours, x), variant)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    graphs_before = _graph_memory() if torch.device(device).type == "cuda" else None
    with Settings(setting):
        for name in list(sides):
            try:
                sync()
                t0 = time.perf_counter()
                sides[name]()
                sync()
                warm = time.perf_counter() - t0
            except RuntimeError as e:  # cuDNN (or the CPU's oneDNN) without this dtype
                if name == "ours":
                    raise
                row["note"] = f"nn.LSTM: {str(e).splitlines()[0][:120]}"
                del sides[name]
                continue
            if warm > row_seconds:
                row["note"] = f"skipped: one {name} run took {warm:.1f} s (> --row-seconds {row_seconds:g})"
                return row
        times = interleaved_times(sides, repeats, warmup=1, device=device)
        row.update(_host_times(sides, repeats, sync))
        if torch.device(device).type == "cuda":
            row.update(_memory(sides, graphs_before))
    med = medians(times)
    row.update(ours=med["ours"], peer=med.get("peer"), samples=times)
    row["of_floor"] = med["ours"] / row["floor"]
    row["host_of_step"] = row["ours_host"] / med["ours"]
    if "peer" in med:
        row["ratio"] = med["peer"] / med["ours"]
    if "variant" in med:
        row.update(variant=med["variant"], variant_gain=med["ours"] / med["variant"])
    return row


def _host_times(sides: Dict[str, object], repeats: int, sync) -> dict:
    """Each side's median time for its call to return (``ours_host``,
    ``peer_host``, ``variant_host``), from a synchronised start, the GPU
    left to finish after the clock stops."""
    host: Dict[str, List[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            sync()
            start = time.perf_counter()
            run()
            host[name].append(time.perf_counter() - start)
            sync()
    return {f"{name}_host": statistics.median(t) for name, t in host.items()}


def _graph_memory() -> Dict[str, int]:
    """Device memory held by the layer ops' graphs and by the stacks'."""
    return dict(ours=int(_C._graph_memory()), variant=stack_graph.graph_memory())


def _memory(sides: Dict[str, object], graphs_before: Dict[str, int]) -> dict:
    """Each side's peak (``ours_memory``, ``peer_memory``,
    ``variant_memory``) with the graphs' memory the row added, and the
    ratio pipelstm / cuDNN."""
    graphs = {k: max(v - graphs_before[k], 0) for k, v in _graph_memory().items()}
    out = {f"{name}_memory": device_peak_bytes(run) + graphs.get(name, 0) for name, run in sides.items()}
    if "peer_memory" in out:
        out["memory_ratio"] = out["ours_memory"] / max(out["peer_memory"], 1)
    return out


def summarize(rows: List[dict]) -> List[dict]:
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting]
        timed = [r for r in mine if r.get("ratio") is not None]
        worst = min(timed, key=lambda r: r["ratio"]) if timed else None
        one = {(r["T"], r["B"], r["H"]): r["ours"] for r in mine if r["layers"] == 1 and r["ours"]}
        stack = [r["ours"] / one[(r["T"], r["B"], r["H"])] for r in mine
                 if r["layers"] == 4 and r["B"] <= 32 and r["ours"] and (r["T"], r["B"], r["H"]) in one]
        out.append(dict(
            setting=setting, rows=len(timed),
            geomean=statistics.geometric_mean(r["ratio"] for r in timed) if timed else None,
            worst=worst and worst["ratio"],
            worst_row=worst and f"L={worst['layers']} T={worst['T']} B={worst['B']} H={worst['H']}",
            at_least_1=sum(r["ratio"] >= 1.0 for r in timed), stack=max(stack) if stack else None,
            memory=max((r["memory_ratio"] for r in mine if r.get("memory_ratio")), default=None),
            host=max((r["host_of_step"] for r in mine if r["B"] <= 32 and r.get("host_of_step")), default=None),
            skipped=sum(r["ours"] is None for r in mine)))  # over --row-seconds or --budget-seconds
    return out


def device_info(device: str) -> Dict[str, object]:
    if torch.device(device).type != "cuda":
        return dict(name="CPU (no GPU: a check that the bench runs)")
    return dict(name=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), capability=list(torch.cuda.get_device_capability()))


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("gpu", __doc__, repeats=5, per="side", quick=report.QUICK)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu with --quick to check the bench")
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    for axis, values in GRID.items():
        p.add_argument(f"--{axis}", type=int, nargs="+", default=None, help=f"default {values}")
    p.add_argument("--row-seconds", type=float, default=3.0,
                   help="skip a row whose warm-up run of either side takes longer (default 3)")
    p.add_argument("--budget-seconds", type=float, default=None,
                   help="start no row after this many seconds (the first always runs); the rest are listed as not run "
                        "(default: no limit)")
    p.add_argument("--variant", nargs="+", default=[], metavar="SWITCH=VALUE",
                   help="also time pipelstm with these pipelstm.backends.cuda switches (persistent=1, "
                        "layer_wavefront=8, graphs=0), alternated with both sides")
    args = report.parse_arguments(p, argv)
    try:
        variant = parse_variant(args.variant)
    except ValueError as e:
        p.error(str(e))
    columns = COLUMNS[:-1] + VARIANT_COLUMNS + COLUMNS[-1:] if variant else COLUMNS
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a GPU; none is visible here (--device cpu --quick checks the bench)")
    if torch.device(args.device).type != "cuda" and not args.quick:
        p.error("--device cpu is only a check that the bench runs: add --quick (the CPU has `bench grid`)")
    grid = {axis: getattr(args, axis) or (QUICK_GRID if args.quick else GRID)[axis] for axis in GRID}
    meta = report.metadata("gpu", argv)
    meta["device"] = device_info(args.device)
    meta["switches"] = {k: os.environ[k] for k in SWITCHES if k in os.environ}
    meta["variant"] = variant
    print(f"torch {torch.__version__}, {meta['device']['name']}, forward+backward, median of {args.repeats} "
          f"interleaved runs; switches {meta['switches'] or 'none'}", flush=True)
    print(header(columns), flush=True)
    rows = []
    start = time.perf_counter()
    for setting, layers, T, B, H in itertools.product(args.settings, grid["layers"], grid["T"], grid["B"],
                                                       grid["H"]):
        if rows and args.budget_seconds is not None and time.perf_counter() - start > args.budget_seconds:
            row = dict(setting=setting, layers=layers, T=T, B=B, H=H, ours=None, peer=None, ratio=None,
                       note=f"not run: past --budget-seconds {args.budget_seconds:g}")
        else:
            row = measure(setting, layers, T, B, H, args.repeats, args.device, args.row_seconds, variant)
        add_row(rows, columns, row)
    summary = summarize(rows)
    tables = [dict(title="Summary", columns=SUMMARY_COLUMNS, rows=summary)]
    report.print_tables(tables)
    notes = ["Settings: fp32 = TF32 off on both sides; default = torch's defaults (TF32 on both sides: "
             "pipelstm follows cudnn.allow_tf32, as nn.LSTM does); bf16/fp16 = both modules in that dtype. Ratio = nn.LSTM time / pipelstm time (> 1: pipelstm "
             "faster). Floor = the largest of bench floors' FLOP, memory and launch floors (H100 figures).",
             f"Every time is the median of {args.repeats} runs of each side, alternated in one process."]
    report.write_json(args.json, meta, columns, rows, notes=notes, tables=tables)
    return rows
