"""Where a training step's time goes on the GPU: pipelstm.LSTM and nn.LSTM
(cuDNN) side by side under torch.profiler, one row per size and side.

For each size, after warm-up, one profiled step (forward and backward of the
output's sum) gives its wall time, the GPU's busy time (the union of its
kernels' intervals: time with at least one kernel running), the kernel
count, the host operators that took the most time of their own, and the
kernels and copies that took the GPU longest. A step
whose busy time is well under its wall time waits on the host.

    python tools/gpu_profile.py --json out.json                     # the default sizes
    python tools/gpu_profile.py --setting default --size 100 256 1024 1

Needs a GPU.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from pipelstm.bench.gpu import SETTINGS, Settings, models, training_step

SIZES = [(100, 256, 1024, 1), (100, 8, 512, 1), (100, 32, 1024, 1), (100, 8, 512, 4)]  # T, B, H, layers


def busy_seconds(intervals):
    """The length of the union of [start, end) intervals (microseconds in, seconds out)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total * 1e-6


def profile_step(model, x, steps=3):
    step = training_step(model, x)
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "trace.json"))
        with open(os.path.join(d, "trace.json")) as f:
            events = json.load(f)["traceEvents"]
    device_work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in device_work if e["cat"] == "kernel"]
    ops = prof.key_averages()
    top = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    return dict(wall=wall, busy=busy_seconds(kernels), kernels=len(kernels),
                host_ops=[dict(name=e.key, calls=e.count, self_ms=e.self_cpu_time_total / 1e3) for e in top],
                device_ops=top_device_work(device_work))


def top_device_work(events, n=8):
    """The kernels, copies and fills that took the GPU longest, by name
    (calls and milliseconds together)."""
    by_name = {}
    for e in events:
        calls, us = by_name.get(e["name"], (0, 0.0))
        by_name[e["name"]] = (calls + 1, us + e["dur"])
    top = sorted(by_name.items(), key=lambda kv: kv[1][1], reverse=True)[:n]
    return [dict(name=name[:120], calls=calls, ms=us / 1e3) for name, (calls, us) in top]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=SETTINGS, nargs="+", default=["default", "fp16"])
    p.add_argument("--size", type=int, nargs=4, action="append", metavar=("T", "B", "H", "LAYERS"))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a GPU")
    rows = []
    for setting in args.setting:
        for T, B, H, layers in args.size or SIZES:
            peer, ours, x = models(setting, layers, T, B, H, "cuda")
            with Settings(setting):
                for side, model in (("pipelstm", ours), ("cuDNN", peer)):
                    r = dict(setting=setting, T=T, B=B, H=H, layers=layers, side=side, **profile_step(model, x))
                    rows.append(r)
                    print(f"{setting:8} T={T} B={B} H={H} L={layers} {side:8}: wall {r['wall'] * 1e3:7.2f} ms, "
                          f"GPU busy {r['busy'] * 1e3:7.2f} ms ({r['busy'] / r['wall']:4.0%}), "
                          f"{r['kernels']} kernels; host: " +
                          ", ".join(f"{o['name']} {o['self_ms']:.2f} ms/{o['calls']}" for o in r["host_ops"][:4]),
                          flush=True)
                    for o in r["device_ops"][:5]:
                        print(f"    GPU {o['ms']:7.3f} ms/{o['calls']:<4} {o['name'][:90]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
