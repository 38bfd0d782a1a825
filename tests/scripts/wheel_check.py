"""Run by `make test-wheel` in a fresh virtual environment that holds only
the built wheel and the torch it was built against (tests/../mk/wheel.mk):
pipelstm imports from that environment, not from the source tree, and its
LSTM matches nn.LSTM forward and backward in float64 (same weights, same
input, a loss weighting every output element differently), the README's
lines of use run as they stand, and the wheel requires exactly the torch
release it was built against, and numpy."""

import importlib.metadata
import re
import sys
from pathlib import Path

import torch
from torch import nn

import pipelstm

where = Path(pipelstm.__file__).resolve()
assert Path(sys.prefix).resolve() in where.parents, f"pipelstm imported from {where}, not from {sys.prefix}"

torch.manual_seed(0)
kw = dict(input_size=5, hidden_size=7, num_layers=2, bidirectional=True)
ref = nn.LSTM(**kw).double()
ours = pipelstm.LSTM(**kw).double()
ours.load_state_dict(ref.state_dict())

x = torch.randn(6, 3, 5, dtype=torch.float64, requires_grad=True)


def run(model):
    out, (h, c) = model(x)
    weights = [torch.randn(t.shape, dtype=t.dtype, generator=torch.Generator().manual_seed(k))
               for k, t in enumerate((out, h, c))]
    loss = sum((t * w).sum() for t, w in zip((out, h, c), weights))
    return [out, h, c, *torch.autograd.grad(loss, [x, *model.parameters()])]


for k, (a, e) in enumerate(zip(run(ours), run(ref))):
    torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=lambda m, k=k: f"item {k}: {m}")
# The README's "Use" block, as a user would paste it.
readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
use = re.search(r"^## Use\n.*?```python\n(.*?)```", readme, re.MULTILINE | re.DOTALL)
assert use, "README.md has no ```python block under ## Use"
exec(compile(use.group(1), "README.md (Use)", "exec"), {})

# The wheel requires the torch release it was built against, exactly, and
# numpy (torch.distributed's object collectives need it).
requires = importlib.metadata.requires("pipelstm") or []
release = torch.__version__.split("+")[0]
assert f"torch=={release}" in requires, f"the wheel requires {requires}, not torch=={release}"
assert "numpy" in requires, f"the wheel requires {requires}, not numpy"

print(f"wheel OK: pipelstm {pipelstm.__version__} from {where.parent}, torch {torch.__version__}")
