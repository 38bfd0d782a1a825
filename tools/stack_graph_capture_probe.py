"""Why the stack graph's first capture of a process fails (GPU only).

On an H200 the stack graph at K = 1 (4 layers, T = 60, B = 8, H = 256,
float32), the first capture of its process, failed with "operation failed
due to a previous error during capture"; K = 4 and K = 15 captured after it.
This runs that call three times (eager, capture, replay), each variant in a
fresh process, and prints the captures and replays it got, the warning, the
failed capture's traceback and the CUDA driver's log (CUDA_LOG_FILE):

* ``head``: the tree as it is (the capture stream warmed by a GEMM and its
  backward, ``stack.graph._warm``);
* ``fwdwarm``: warmed by forward GEMMs only (this thread's cuBLAS handle);
* ``nowarm``: not warmed;
* ``global``: not warmed, captured in ``global`` mode instead of ``relaxed``.

``nowarm`` failing where ``head`` captures says the per-thread, per-stream
cuBLAS state made inside the capture was the cause; ``fwdwarm`` failing too,
that autograd's thread's was. ``nowarm`` capturing in a fresh process says
it depends on what ran before it in the process.

    python tools/stack_graph_capture_probe.py     # from the repository root; about 40 s
"""

import os
import subprocess
import sys
import textwrap

CASE = textwrap.dedent(r'''
import sys, traceback, warnings, torch, pipelstm
from pipelstm.stack import graph as sg
from pipelstm.backends import cuda as switches
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
variant = sys.argv[1]
T, B, H, L = 60, 8, 256, 4
if variant in ("nowarm", "global"):
    sg._warm = lambda *a, **k: None
if variant == "fwdwarm":
    def _warm(stream, replay, dtype):
        stream.wait_stream(replay)
        with torch.cuda.stream(stream):
            a = torch.ones(16, 16, device=stream.device)
            torch.mm(a, a)
            torch.addmm(a[0], a, a)
        stream.synchronize()
    sg._warm = _warm
if variant == "global":
    class _Global(torch.cuda.graph):
        def __init__(self, *a, **k):
            k["capture_error_mode"] = "global"
            super().__init__(*a, **k)
    torch.cuda.graph = _Global
def capture(entry, body, inputs, params):
    try:
        sg.capture_cuda(entry, body, inputs, params)
    except RuntimeError:
        print("TRACE", variant, traceback.format_exc()[-2500:], flush=True)
        raise
sg._graphs = sg.StackGraphs(capture=capture)
torch.manual_seed(0)
lstm = pipelstm.LSTM(H, H, num_layers=L).cuda()
with warnings.catch_warnings(record=True) as caught, switches.flags(stack_graph=1):
    warnings.simplefilter("always")
    for seed in range(3):  # eager, capture, replay
        x = torch.randn(T, B, H, device="cuda", requires_grad=True)
        h0, c0 = (torch.randn(L, B, H, device="cuda", requires_grad=True) for _ in range(2))
        out, (h, c) = lstm(x, (h0, c0))
        (out.sum() + 0.5 * h.sum() + 0.25 * c.sum()).backward()
    torch.cuda.synchronize()
said = [str(m.message)[:300] for m in caught if "captur" in str(m.message)]
print("RESULT", variant, "captures", sg._graphs.captures, "replays", sg._graphs.replays, said, flush=True)
''')


def main() -> None:
    env = {**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "1", "CUDA_LOG_FILE": "stderr"}
    for variant in ("head", "fwdwarm", "nowarm", "global"):
        r = subprocess.run([sys.executable, "-c", CASE, variant], capture_output=True, text=True, timeout=120,
                           env=env)
        print(f"=== {variant}: rc {r.returncode}")
        print(r.stdout[-3000:])
        print("stderr tail:", r.stderr[-1500:])


if __name__ == "__main__":
    main()
