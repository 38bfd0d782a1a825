"""Checks the machine code of the persistent tensor-core kernels (no GPU needed).

Per step, each warp of these kernels loads the B fragments of its K-tiles
from L2 and feeds them to mma.sync. ptxas keeps those loads in program order
with the mma before them, so a loop that loads one K-tile's fragments and
then multiplies them waits one L2 round trip per K-tile. The kernels load
tc::kLoadDepth K-tiles' fragments before the first of their mma; this check
compiles them for sm_90, disassembles the cubin and fails unless every
kernel issues at least that many K-tiles' loads (2 registers each) in one
run before an mma.

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
HEADER = Path("kernels/include/pipelstm/kernels/lstm_persistent_tc.h")
KERNELS = ("tc_forward_kernel", "tc_backward_kernel")


def load_depth() -> int:
    match = re.search(r"constexpr int kLoadDepth = (\d+);", HEADER.read_text())
    if not match:
        sys.exit(f"FAIL {HEADER}: no 'constexpr int kLoadDepth = N;'")
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


def disassemble(workdir: Path) -> str:
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/bin/nvcc"
    cubin = workdir / "persistent_tc.cubin"
    subprocess.run([nvcc, "-std=c++17", "-O3", "-cubin", "-arch=sm_90", "-I", "kernels/include",
                    str(SOURCE), "-o", str(cubin)], check=True)
    return subprocess.run([find_nvdisasm(), str(cubin)], check=True, capture_output=True,
                          text=True).stdout


def longest_load_run(sass: str) -> dict[str, int]:
    """Per kernel (name and element type), the most L2 loads issued in a row
    before an mma (loads bypassing L1: LDG ... STRONG.GPU)."""
    runs: dict[str, int] = {}
    name, run = None, 0
    for line in sass.splitlines():
        header = re.match(r"^\.text\.(\S+):", line)
        if header:
            symbol = header.group(1)
            kernel = next((k for k in KERNELS if k in symbol), None)
            name = f"{kernel} ({'bf16' if 'bfloat16' in symbol else 'fp16'})" if kernel else None
            run = 0
            if name:
                runs[name] = 0
            continue
        if name is None:
            continue
        if "LDG" in line and "STRONG.GPU" in line:
            run += 1
        elif "HMMA" in line:
            runs[name] = max(runs[name], run)
            run = 0
    return runs


def main() -> int:
    depth = load_depth()
    with tempfile.TemporaryDirectory() as tmp:
        runs = longest_load_run(disassemble(Path(tmp)))
    status = 0
    if len(runs) != 2 * len(KERNELS):
        print(f"FAIL {SOURCE}: expected {2 * len(KERNELS)} kernels in the cubin, found {sorted(runs)}")
        return 1
    for name, run in sorted(runs.items()):
        # Each K-tile's two B registers take one to three loads (the kernels
        # carry an aligned and an unaligned variant, predicated).
        ok = run >= 2 * depth
        status |= not ok
        print(f"{'OK  ' if ok else 'FAIL'} {name}: {run} L2 loads in a row before an mma "
              f"(want >= {2 * depth}: {depth} K-tiles' B fragments)")
    return status


if __name__ == "__main__":
    sys.exit(main())
