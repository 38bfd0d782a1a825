"""torchrun script for tests/test_distributed.py: rank 1 builds a different
model (hidden 24 instead of 16); every rank must stop at start-up."""

import torch
from torch import nn

import pipelstm
import pipelstm.distributed as pdist

mesh = pdist.init_mesh(pp=2, timeout=20)
hidden = 24 if mesh.rank == 1 else 16
model = nn.Sequential(nn.Embedding(10, 8), pipelstm.LSTM(8, hidden, num_layers=2), nn.Linear(hidden, 10))
pdist.PipelineParallel(model, mesh)
print("constructed: the mismatch went unnoticed", flush=True)
