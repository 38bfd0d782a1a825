"""Headline figures of the benchmarks, one renderer per bench family.

``python -m pipelstm.bench docs`` fills a section between
``<!-- bench-summary:NAME1,NAME2,...:begin -->`` and
``<!-- bench-summary:NAME1,NAME2,...:end -->`` with one table of the
headline figures of the result files ``NAME1.json``, ``NAME2.json``, ...:
a few rows per file, each naming what was compared, the result, the
machine (CPU and ISA, or GPU), dtype and threads, the date of the run and
a link to the page that holds the file's full table. Every figure is
computed here from the JSON file, never typed.

A renderer takes one result file (the dict ``report.read_json`` returns)
and returns its rows as dicts with the keys ``what``, ``result`` and
``setup``; :func:`summary_rows` adds the date and the link.
"""

import math
import re
import statistics
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from .table import Column, markdown

__all__ = ["RENDERERS", "summary_rows", "summary_table"]

Row = Dict[str, str]

ISA_NAMES = {"avx512": "AVX-512", "avx2": "AVX2", "generic": "generic"}
DTYPES = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16", "float16": "fp16"}
GPU_SETTINGS = {"fp32": "fp32, TF32 off on both sides", "default": "fp32, torch's defaults (cuDNN uses TF32)",
                "bf16": "bf16", "fp16": "fp16"}


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _span(values: Sequence[float]) -> str:
    """``1.25×`` or ``1.25–1.54×``, over the values that are numbers."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return _x(lo) if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"


def _cpu(data: Mapping) -> str:
    """The CPU and the ISA pipelstm's kernels ran with (``capped`` when an
    environment variable capped it below the CPU's widest)."""
    m = data["machine"]
    isa = m.get("isa") or {}
    name = ISA_NAMES.get(isa.get("pipelstm"), isa.get("aten") or "unknown ISA")
    env = isa.get("env") or {}
    capped = " (capped)" if env.get("PIPELSTM_CPU_ISA") else ""
    timed = ", paths chosen by timing" if env.get("PIPELSTM_CPU_BENCHMARK") == "1" else ""
    c = m.get("cpu_class")
    cls = f" ({c['microarchitecture']}, family {c['family']} model {c['model']})" if c else ""
    return f"{m.get('cpu') or 'unknown CPU'}{cls}, {name}{capped}{timed}"


def _threads(rows: Sequence[Mapping], data: Mapping) -> str:
    counts = sorted({r["threads"] for r in rows if r.get("threads") is not None})
    if not counts:
        counts = [data["machine"].get("threads")]
    words = " and ".join(str(c) for c in counts)
    return f"{words} thread" + ("" if counts == [1] else "s")


def _model(data: Mapping) -> str:
    """The LSTM stack and batch of the model a pipeline bench names in its notes."""
    for note in data.get("notes") or []:
        m = re.search(r"(\d+) x LSTM\(H=(\d+)\).*?(T=\d+, B=\d+)", note)
        if note.startswith("Model: ") and m:
            return f"{m[1]} × LSTM(H={m[2]}) with embedding and decoder, {m[3]}"
    return "its model"


def grid(data: Mapping) -> List[Row]:
    """bench grid: the geometric means per (threads, mode) and the rows at 1.0x or above."""
    summary = data["tables"][0]["rows"]
    rows = sum(s["rows"] for s in summary)
    at_least = sum(s["at_least_1"] for s in summary)
    variants = [v for v in ("bidirectional", "proj", "packed") if any(r.get("variant") == v for r in data["rows"])]
    kinds = ", ".join(["sizes", "layers"] + [dict(proj="projection").get(v, v) for v in variants])
    return [dict(what=f"`pipelstm.LSTM` vs `nn.LSTM`, CPU grid of {rows} rows ({kinds}; forward and forward + "
                      "backward)",
                 result=f"geometric mean {_span([s['geomean'] for s in summary])} per threads × mode; "
                        f"{at_least} of {rows} rows ≥ 1.0× (lowest {_x(min(s['worst'] for s in summary))})",
                 setup=f"{_cpu(data)}, fp32, {_threads(data['rows'], data)}")]


def gpu(data: Mapping) -> List[Row]:
    """bench gpu: per setting, the geometric mean against cuDNN and the rows at 1.0x or above;
    with ``--variant``, the variant's gain over pipelstm's default instead."""
    device = data.get("device") or {}
    name = device.get("name", "unknown GPU") if isinstance(device, Mapping) else str(device)
    T = "/".join(str(t) for t in sorted({r["T"] for r in data["rows"]}))
    if data.get("variant"):
        return _gpu_variant(data, name, T)
    out = []
    for s in data["tables"][0]["rows"]:
        if not s.get("rows") or s.get("geomean") is None:  # a setting the run left out
            continue
        ratios = [r["ratio"] for r in data["rows"] if r["setting"] == s["setting"] and r.get("ratio")]
        skipped = f"; {s['skipped']} rows over the time budget" if s.get("skipped") else ""
        out.append(dict(what=f"`pipelstm.LSTM` vs cuDNN, forward + backward, {s['rows']} sizes, T={T}",
                        result=f"geometric mean {_x(s['geomean'])}; {s['at_least_1']} of {s['rows']} rows ≥ 1.0× "
                               f"(range {_span(ratios)}){skipped}",
                        setup=f"{name}, {GPU_SETTINGS.get(s['setting'], s['setting'])}"))
    return out


def _gpu_variant(data: Mapping, name: str, T: str) -> List[Row]:
    switches = ", ".join(f"{k}={v}" for k, v in data["variant"].items())
    out = []
    for setting in dict.fromkeys(r["setting"] for r in data["rows"]):
        gains = [r["variant_gain"] for r in data["rows"] if r["setting"] == setting and r.get("variant_gain")]
        if not gains:
            continue
        layers = "/".join(str(n) for n in sorted({r["layers"] for r in data["rows"] if r["setting"] == setting}))
        out.append(dict(what=f"`pipelstm.LSTM` with `{switches}` vs without, forward + backward, {len(gains)} sizes, "
                             f"{layers} layer(s), T={T}",
                        result=f"geometric mean {_x(statistics.geometric_mean(gains))}; "
                               f"{sum(g >= 1.0 for g in gains)} of {len(gains)} rows ≥ 1.0× (range {_span(gains)})",
                        setup=f"{name}, {GPU_SETTINGS.get(setting, setting)}"))
    return out


def lm(data: Mapping) -> List[Row]:
    """bench lm: the training step against nn.LSTM on the same cores, per size."""
    summary = data["tables"][0]["rows"]
    sizes = " / ".join(s["size"] for s in summary)
    ours = " / ".join(_x(s["ours_ratio"]) for s in summary)
    pipe = " / ".join(_x(s["pipe_ratio"]) for s in summary)
    # older files have no 1-thread comparison
    stages = " / ".join(_x(s["pipe_vs_one"]) for s in summary) if all(s.get("pipe_vs_one") for s in summary) else None
    vs_one = f" ({stages} its 1-thread `pipelstm.LSTM` model)" if stages else ""
    return [dict(what=f"LM training step (4 × LSTM, 10k-word decoder) vs the `nn.LSTM` model on the same "
                      f"2 cores, {sizes}",
                 result=f"`pipelstm.LSTM` on 2 threads {ours}; 2-stage `Pipeline`, 1 thread each, {pipe}{vs_one}",
                 setup=f"{_cpu(data)}, fp32, 2 cores")]


def _pipelines(data: Mapping, ours: str, unit: str) -> Row:
    """bench pipeline and bench distributed: the best 2-stage configuration
    against one stage, the equal-cores models and torch.distributed.pipelining."""
    rows = data["rows"]
    one = next(r for r in rows if r["kind"] == "pipelstm" and not r.get("K"))
    staged = [r for r in rows if r["kind"] == "pipelstm" and r.get("K")]
    best = min(staged, key=lambda r: r["seconds"])
    base = {("nn" if r["config"].startswith("nn.LSTM") else "ours"): r for r in rows if r["kind"] == "baseline"}
    peers = [r["seconds"] / best["seconds"] for r in rows if r["kind"] == "peer"]
    parts = [f"best {ours} (K={best['K']}, M={best['M']}) {best['seconds']:.3g} s a step: "
             f"{_x(one['seconds'] / best['seconds'])} one {unit}"]
    if "ours" in base:
        parts.append(f"{_x(base['ours']['seconds'] / best['seconds'])} `pipelstm.LSTM` model on 2 threads")
    if "nn" in base:
        parts.append(f"{_x(base['nn']['seconds'] / best['seconds'])} `nn.LSTM` model on 2 threads")
    if peers:
        parts.append(f"{_span(peers)} `torch.distributed.pipelining`")
    return dict(what=f"LM training step, {_model(data)}", result="; ".join(parts),
                setup=f"{_cpu(data)}, fp32, 2 stages × 1 thread")


def pipeline(data: Mapping) -> List[Row]:
    """bench pipeline: 2 stages in one process."""
    return [_pipelines(data, "2-stage `Pipeline` in one process", "stage")]


def distributed(data: Mapping) -> List[Row]:
    """bench distributed: pp=2 over 2 processes, with each stage's memory."""
    row = _pipelines(data, "`PipelineParallel` pp=2 (2 processes)", "process")
    memory = (data.get("tables") or [{}])[0].get("rows") or []
    staged = [m for m in memory if m.get("K") and m["config"].startswith("pipelstm")]
    if staged:
        row["result"] += (f"; each stage's memory rise {_span([m['rise_of_one'] for m in staged])} "
                          "of the 1-process model's")
    return [row]


def module(data: Mapping) -> List[Row]:
    """bench module: the whole module against nn.LSTM, dense and packed input."""
    rows = data["rows"]
    dense = [r["speedup"] for r in rows if r["case"] != "packed"]
    packed = [r["speedup"] for r in rows if r["case"] == "packed"]
    dtypes = "/".join(sorted({DTYPES.get(r.get("dtype", "float32"), str(r.get("dtype"))) for r in rows}))
    r0 = rows[0]
    result = f"dense {_span(dense)}" + (f"; packed {_span(packed)} `nn.LSTM` packed" if packed else "")
    return [dict(what=f"`pipelstm.LSTM` vs `nn.LSTM` module, forward + backward, T={r0['T']} B={r0['B']} "
                      f"H={r0['H']}", result=result, setup=f"{_cpu(data)}, {dtypes}, {_threads(rows, data)}")]


def layer(data: Mapping) -> List[Row]:
    """bench layer: the layer op (1 and 4 layers) against nn.LSTM."""
    rows = data["rows"]
    return [dict(what="layer op (1 layer, a 4-layer stack) vs `nn.LSTM`, forward + backward",
                 result=f"{_span([r['speedup'] for r in rows])}; "
                        f"{min(r['gflops'] for r in rows):.0f}–{max(r['gflops'] for r in rows):.0f} GFLOP/s",
                 setup=f"{_cpu(data)}, fp32, {_threads(rows, data)}")]


def wavefront(data: Mapping) -> List[Row]:
    """bench wavefront: one process's layer wavefront against its intra-op threads."""
    rows = data["rows"]
    wins = sum(1 for r in rows if r["wave_vs_threads"] > 1.0)
    return [dict(what="`pipelstm.LSTM(devices=[\"cpu\"] * 2, threads=1)` (layer wavefront) vs "
                      "`pipelstm.LSTM` on 2 intra-op threads, 2 and 4 layers",
                 result=f"wavefront faster in {wins} of {len(rows)} rows "
                        f"(wavefront / threads {_span([r['wave_vs_threads'] for r in rows])}); "
                        f"threads vs `nn.LSTM` {_span([r['threads_x'] for r in rows])}",
                 setup=f"{_cpu(data)}, fp32, 2 cores")]


def peak(data: Mapping) -> List[Row]:
    """bench peak: the cores' FMA ceiling beside torch.mm."""
    rows = sorted(data["rows"], key=lambda r: r["threads"])
    threads = " / ".join(str(r["threads"]) for r in rows)
    fma = " / ".join(f"{r['fma_gflops']:.0f}" for r in rows)
    mm = " / ".join(f"{r['mm_gflops']:.0f}" for r in rows)
    return [dict(what="register-only FMA loop (the ceiling of any rate here) beside a 2048² `torch.mm`",
                 result=f"FMA loop {fma} GFLOP/s on {threads} threads; `torch.mm` {mm} GFLOP/s",
                 setup=f"{_cpu(data)}, fp32, {_threads(rows, data)}")]


def small(data: Mapping) -> List[Row]:
    """bench small: the modules against torch.nn's at small sizes, per module and mode."""
    out = []
    for module in dict.fromkeys(r["module"] for r in data["rows"]):
        rows = [r for r in data["rows"] if r["module"] == module]
        modes = "; ".join(f"{mode} {_span([r['speedup'] for r in rows if r['mode'] == mode])}"
                          for mode in dict.fromkeys(r["mode"] for r in rows))
        sizes = sorted({(r["B"], r["H"]) for r in rows})
        out.append(dict(what=f"`pipelstm.{module}` vs `nn.{module}` at small sizes (B {sizes[0][0]}–{sizes[-1][0]}, "
                             f"H {min(h for _, h in sizes)}–{max(h for _, h in sizes)})",
                        result=f"{modes}; {sum(r['speedup'] >= 1.0 for r in rows)} of {len(rows)} rows ≥ 1.0×",
                        setup=f"{_cpu(data)}, fp32, {_threads(rows, data)}"))
    return out


RENDERERS: Dict[str, Callable[[Mapping], List[Row]]] = dict(
    grid=grid, gpu=gpu, lm=lm, pipeline=pipeline, distributed=distributed, module=module, layer=layer,
    wavefront=wavefront, peak=peak, small=small)


def summary_rows(data: Mapping, link: Optional[str]) -> List[Row]:
    """The headline rows of one result file, with its date and a link to
    its full table (``link``: a path relative to the doc, or None when the
    table is on the same page).

    Raises:
        KeyError: the file's bench has no summary renderer.
    """
    rows = RENDERERS[data["bench"]](data)
    for row in rows:
        row["date"] = data["date"][:10]
        row["details"] = f"[table]({link})" if link else "below"
    return rows


def summary_table(rows: Sequence[Row]) -> str:
    """The markdown table of headline rows (no trailing newline)."""
    columns = [Column("what", "benchmark"), Column("result", "result (> 1×: pipelstm faster)"),
               Column("setup", "measured on"), Column("date", "date"), Column("details", "details")]
    return markdown(columns, rows)
