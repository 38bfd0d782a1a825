"""torchrun script for tests/test_distributed.py: a zoneout LSTM model
(tests/test_pipeline_zoneout.py's) in two PipelineParallel stages, one
training step with every rank seeded alike, so that each stage's pass seed
is the one an in-process pass draws after the same seed. Each rank saves
the loss and its stage's gradients, by the unsplit model's names, to
OUT/rank<R>.pt."""

import os
import sys

import torch
from torch import nn

import pipelstm.distributed as pdist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_pipeline_zoneout import SEED, V, _model  # noqa: E402

out = sys.argv[1]
T, B, K, M = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
mesh = pdist.init_mesh(pp=2, timeout=60)
model = _model("lstm")  # float64: Embedding, the 2-layer LSTM, Linear
pipe = pdist.PipelineParallel(model, mesh, chunks=K, micro_batches=M, balance=[2, 2], threads=1,
                              carry_state=False, loss_fn=nn.CrossEntropyLoss())
g = torch.Generator().manual_seed(5)
x, y = torch.randint(0, V, (T, B), generator=g), torch.randint(0, V, (T, B), generator=g)
torch.manual_seed(SEED)
loss = pipe.train_step(x, y)
grads = {name: p.grad for name, p in pipe.named_stage_parameters()}
torch.save(dict(loss=loss, grads=grads, x=x, y=y), os.path.join(out, f"rank{mesh.rank}.pt"))
