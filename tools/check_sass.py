"""Checks the machine code of the persistent tensor-core kernels (no GPU needed).

Per step, each warp of these kernels loads the B fragments of its K-tiles
from L2 and feeds them to mma.sync, then the lanes that finish a cell load
its inputs (input gates or the forward's activated gates, cells, incoming
gradients) and write its results. ptxas keeps loads in program order behind
an earlier mma or an earlier store to another array, so code that loads
and uses one K-tile, or one cell, at a time waits one memory round trip for
each. This check compiles the kernels for sm_90, disassembles the cubin and
fails unless every kernel
  - issues the B fragments of tc::kLoadDepth K-tiles (2 registers each) in
    one run of L2 loads before an mma, and
  - loads all of a lane's cells' inputs (2 cells x 5 values in the
    forward, 4 cells x 8 values in the backward) before the product's mma,
    with no store or barrier between them and it, and
  - accumulates into kChains independent register sets per M-tile (the
    mma into one set wait for each other's results one by one);
and unless the cluster forward (lstm_persistent_cluster.cu), both ways of
separating its steps, loads a lane's cells' inputs for the next step (2
cells x 5 values) after the step's last store and before it waits for the
next step's h.

Usage: python tools/check_sass.py  (from the repository root; nvcc from
$NVCC or PATH, nvdisasm from PATH, $CUDA_HOME/bin or the nvidia-cuda-nvdisasm
wheel of requirements-dev.txt)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path("kernels/src/cuda/lstm_persistent_tc.cu")
CLUSTER_SOURCE = Path("kernels/src/cuda/lstm_persistent_cluster.cu")
DEVICE = Path("kernels/src/cuda/tc_device.cuh")  # the pieces the kernels share (kChains)
HEADER = Path("kernels/include/pipelstm/kernels/lstm_persistent_tc.h")
KERNELS = ("tc_forward_kernel", "tc_backward_kernel")


def constant(path: Path, name: str) -> int:
    match = re.search(rf"constexpr int {name} = (\d+);", path.read_text())
    if not match:
        sys.exit(f"FAIL {path}: no 'constexpr int {name} = N;'")
    return int(match.group(1))


def find_nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    candidates = [cuda_home / "bin" / "nvdisasm"]
    try:
        import nvidia  # the nvidia-cuda-nvdisasm wheel's namespace package

        for root in nvidia.__path__:
            candidates += sorted(Path(root).glob("cu*/bin/nvdisasm"))
    except ImportError:
        pass
    for path in candidates:
        if path.is_file():
            return str(path)
    sys.exit("FAIL nvdisasm not found: install requirements-dev.txt (nvidia-cuda-nvdisasm) "
             "or put the CUDA toolkit's bin on PATH")


def disassemble(workdir: Path, source: Path = SOURCE) -> str:
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/bin/nvcc"
    cubin = workdir / f"{source.stem}.cubin"
    subprocess.run([nvcc, "-std=c++17", "-O3", "-cubin", "-arch=sm_90", "-I", "kernels/include",
                    str(source), "-o", str(cubin)], check=True)
    return subprocess.run([find_nvdisasm(), str(cubin)], check=True, capture_output=True,
                          text=True).stdout


# The loads of one lane's cells in the finish phase: 2 cells x (4 input
# gates + c_prev) forward; 4 cells x (4 gates, c, c_prev, grad_c,
# grad_output) backward.
FINISH_LOADS = {"tc_forward_kernel": 2 * 5, "tc_backward_kernel": 4 * 8}
# M-tiles an item's product adds into: a forward unit tile is two.
M_TILES = {"tc_forward_kernel": 2, "tc_backward_kernel": 1}


def measures(sass: str) -> dict[str, tuple[int, int, int]]:
    """Per kernel (name and element type): the most L2 loads (LDG ...
    STRONG.GPU, bypassing L1) issued in a row before an mma, the most other
    global loads issued before an mma since the last store or barrier, and
    how many registers the mma accumulate into."""
    runs: dict[str, list[int]] = {}
    accumulators: dict[str, set[str]] = {}
    name = None
    l2_run = plain_run = 0
    for line in sass.splitlines():
        header = re.match(r"^\.text\.(\S+):", line)
        if header:
            symbol = header.group(1)
            kernel = next((k for k in KERNELS if k in symbol), None)
            name = f"{kernel} ({'bf16' if 'bfloat16' in symbol else 'fp16'})" if kernel else None
            l2_run = plain_run = 0
            if name:
                runs[name] = [0, 0]
                accumulators[name] = set()
            continue
        if name is None:
            continue
        if "LDG" in line and "STRONG.GPU" in line:
            l2_run += 1
        elif "LDG" in line:
            plain_run += 1
        elif "HMMA" in line:
            accumulators[name].add(re.search(r"HMMA\S* (R\d+),", line).group(1))
            runs[name][0] = max(runs[name][0], l2_run)
            runs[name][1] = max(runs[name][1], plain_run)
            l2_run = 0
        elif "STG" in line or re.search(r"\bBAR\.", line):
            plain_run = 0
    return {name: (l2, plain, len(accumulators[name])) for name, (l2, plain) in runs.items()}


def cluster_loads_ahead(sass: str) -> dict[str, int]:
    """Per cluster forward kernel (element type, way of separating steps):
    the most global loads issued after a store and before a wait for the
    next step's h (the mbarrier's try-wait, or the cluster barrier's wait)."""
    most: dict[str, int] = {}
    name, run = None, 0
    for line in sass.splitlines():
        header = re.match(r"^\.text\.(\S+):", line)
        if header:
            symbol = header.group(1)
            sync = re.search(r"SyncE([01])E", symbol)
            name = (f"cluster_forward_kernel ({'bf16' if 'bfloat16' in symbol else 'fp16'}, "
                    f"{'st.async' if sync and sync.group(1) == '1' else 'barrier'})"
                    if "cluster_forward_kernel" in symbol else None)
            run = 0
            if name:
                most[name] = 0
            continue
        if name is None:
            continue
        if "LDG" in line:
            run += 1
        elif re.search(r"\b(STG|STAS|STS|ST)\b", line):
            run = 0
        elif "SYNCS.PHASECHK" in line or "UCGABAR_WAIT" in line:
            most[name] = max(most[name], run)
    return most


def main() -> int:
    depth = constant(HEADER, "kLoadDepth")
    chains = constant(DEVICE, "kChains")
    with tempfile.TemporaryDirectory() as tmp:
        runs = measures(disassemble(Path(tmp)))
        ahead = cluster_loads_ahead(disassemble(Path(tmp), CLUSTER_SOURCE))
    if len(runs) != 2 * len(KERNELS):
        print(f"FAIL {SOURCE}: expected {2 * len(KERNELS)} kernels in the cubin, found {sorted(runs)}")
        return 1
    status = 0
    for name, (l2, plain, sets) in sorted(runs.items()):
        kernel = name.split()[0]
        # Each register takes one to three loads (the kernels carry an
        # aligned and an unaligned variant, predicated).
        checks = [(l2, 2 * depth, f"L2 loads in a row before an mma ({depth} K-tiles' B fragments)"),
                  (plain, FINISH_LOADS[kernel], "loads of a lane's cells before an mma, after the last store"),
                  (sets, chains * M_TILES[kernel], f"accumulator registers of the mma ({chains} chains)")]
        for got, want, what in checks:
            ok = got >= want
            status |= not ok
            print(f"{'OK  ' if ok else 'FAIL'} {name}: {got} {what}, want >= {want}")
    if len(ahead) != 4:
        print(f"FAIL {CLUSTER_SOURCE}: expected 4 forward kernels in the cubin, found {sorted(ahead)}")
        return 1
    want = FINISH_LOADS["tc_forward_kernel"]
    for name, got in sorted(ahead.items()):
        ok = got >= want
        status |= not ok
        print(f"{'OK  ' if ok else 'FAIL'} {name}: {got} loads of the next step's cells between the "
              f"step's last store and its wait, want >= {want}")
    return status


if __name__ == "__main__":
    sys.exit(main())
