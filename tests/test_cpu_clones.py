"""The CPU kernels' entry points built for several instruction sets at once
(kernels/src/cpu/cpu_clones.h): each AVX-512 clone holds its loops itself.

GCC does not inline a plain function into a clone built for another
architecture, so a loop reached through a helper that is not forced inline
(a dispatch lambda, say) runs in the default instruction set, whatever CPU
the library found: right answers, several times slower, and no other test
sees it. The binary's own disassembly does.
"""

import platform
import re
import shutil
import subprocess

import pytest

import pipelstm

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not (shutil.which("nm") and shutil.which("objdump")),
    reason="x86-64 with binutils (nm, objdump) only")

# The float entry points that cpu_clones.h builds as clones.
CLONED = {"pointwise_forward_cpu_f32", "pointwise_backward_cpu_f32", "layernorm_step_forward_rows_f32",
          "layernorm_step_backward_rows_f32", "norm_rows_f32", "norm_backward_rows_f32", "philox_blocks"}


def _clones(library):
    """(name, start, end) of every AVX-512 (x86-64-v4) clone in the library."""
    out = subprocess.run(["nm", "--defined-only", "-S", "-C", library], check=True, capture_output=True,
                         text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[3].endswith("[clone .arch_x86_64_v4]"):
            start, size = int(parts[0], 16), int(parts[1], 16)
            found.append((parts[3], start, start + size))
    return found


def _calls(library, start, end):
    """The targets of every call and tail jump out of [start, end)."""
    listing = subprocess.run(["objdump", "-d", f"--start-address={start}", f"--stop-address={end}", library],
                             check=True, capture_output=True, text=True).stdout
    targets = []
    for m in re.finditer(r"\b(call|jmp)q?\s+([0-9a-f]+) <([^>]+)>", listing):
        if not start <= int(m.group(2), 16) < end:
            targets.append(m.group(3))
    return targets


def test_every_avx512_clone_calls_only_the_math_library():
    library = pipelstm._C.__file__
    clones = _clones(library)
    names = {re.search(r"::(\w+)\(", name).group(1) for name, _, _ in clones}
    assert CLONED <= names, f"missing AVX-512 clones of {sorted(CLONED - names)} in {library}"
    for name, start, end in clones:
        outside = [t for t in _calls(library, start, end) if not t.endswith("@plt")]
        assert not outside, f"{name} calls {outside}: code built for another instruction set"
