"""Checks the installed CUDA build of pipelstm on a machine without a GPU.

The package must come from this virtual environment (not the in-place CPU
build in python/), contain the CUDA kernels (every op but the CPU-only ones has a CUDA
kernel registered with the dispatcher), run its CPU ops, and answer a CUDA op with
torch's ordinary no-device error rather than a load failure.
"""

import os
import sys

import torch

import pipelstm

location = os.path.realpath(pipelstm.__file__)
assert location.startswith(os.path.realpath(sys.prefix) + os.sep), (
    f"pipelstm imported from {location}, not from the environment {sys.prefix}"
)
assert torch.version.cuda, "this check needs a CUDA build of torch"
assert pipelstm.built_with_cuda(), "pipelstm was built without its CUDA kernels"
# Every op the library defines, but the *_composite ones (ATen ops, no kernel
# of their own), has a kernel per backend: the list comes from the schemas
# registered, so an op added later is checked too.
OPS = sorted(
    name.removeprefix("pipelstm::") for name in torch._C._dispatch_get_all_op_names()
    if name.startswith("pipelstm::")
    and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
)
assert OPS, "no pipelstm op is registered"
# Ops with a CPU kernel only: masks are drawn with torch.rand on every other
# device (pipelstm/regularisation.py, the pipeline's units), where it is
# already parallel.
CPU_ONLY = {"bernoulli_mask"}
assert CPU_ONLY <= set(OPS), f"CPU_ONLY names ops that do not exist: {sorted(CPU_ONLY - set(OPS))}"
for op in OPS:
    for key in ("CPU",) if op in CPU_ONLY else ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pipelstm::{op}", key), f"no {key} kernel for {op}"

out, _ = pipelstm.LSTM(4, 5)(torch.randn(3, 2, 4))
assert out.shape == (3, 2, 5)

if torch.cuda.is_available():
    print("a GPU is present: run tests/gpu for the CUDA checks")
    sys.exit(0)
# Without a GPU no CUDA tensor can exist, so a CUDA op call stops where its
# inputs are made, with torch's own error; the same for the module.
for call in (
    lambda: pipelstm.ops.lstm_layer(*(torch.zeros(1, 1, 4, device="cuda") for _ in range(5))),
    lambda: pipelstm.LSTM(4, 5).cuda(),
):
    try:
        call()
    except RuntimeError as error:
        message = str(error)
        assert "NVIDIA driver" in message or "CUDA" in message, message
    else:
        raise AssertionError("a CUDA op ran without a GPU")
print(f"ok: CUDA build {location} (torch {torch.__version__}); CPU ops run; CUDA kernels registered for "
      f"{len(OPS)} ops; a CUDA call without a GPU: {message.splitlines()[0]}")
