"""Checks the installed CUDA build of pipelstm on a machine without a GPU.

The package must come from the virtual environment (not the in-place CPU
build in python/), contain the CUDA kernels, run its CPU ops, and answer a
CUDA op with torch's ordinary no-device error rather than a load failure.
"""

import sys

import torch

import pipelstm

assert "site-packages" in pipelstm.__file__, f"pipelstm imported from {pipelstm.__file__}, not the installed build"
assert torch.version.cuda, "this check needs a CUDA build of torch"
assert pipelstm.built_with_cuda(), "pipelstm was built without its CUDA kernels"

out, _ = pipelstm.LSTM(4, 5)(torch.randn(3, 2, 4))
assert out.shape == (3, 2, 5)

if torch.cuda.is_available():
    print("a GPU is present: run tests/gpu for the CUDA checks")
    sys.exit(0)
try:
    x = torch.zeros(2, 8, device="cuda")
    torch.ops.pipelstm.lstm_cell_forward(x, x, torch.zeros(2, 2, device="cuda"), None, None)
except RuntimeError as error:
    message = str(error)
    assert "NVIDIA driver" in message or "CUDA" in message, message
    print(f"ok: CUDA build {pipelstm.__file__} (torch {torch.__version__}); CUDA op without a GPU: {message.splitlines()[0]}")
else:
    raise AssertionError("a CUDA op ran without a GPU")
