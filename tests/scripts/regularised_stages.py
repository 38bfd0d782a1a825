"""torchrun script for tests/test_distributed.py: a regularised model in
two PipelineParallel stages, one training step with every rank seeded
alike, so that each stage's pass seed is the one an in-process pass draws
after the same seed. KIND: "zoneout" (tests/test_pipeline_zoneout.py's
zoneout LSTM model, a layer in each stage), "variational"
(tests/test_locked_dropout.py's model: locked dropout on the embeddings,
between the layers and on the output) or "weight" (tests/pipeline_models.py's
weight_dropped_model: DropConnect on each layer's weight_hh, a layer in each
stage). Each rank saves the loss and its
stage's gradients, by the unsplit model's names, to OUT/rank<R>.pt.

    regularised_stages.py OUT KIND T B K M
"""

import os
import sys

import torch
from torch import nn

import pipelstm.distributed as pdist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline_models import weight_dropped_model  # noqa: E402
from test_locked_dropout import _variational_model  # noqa: E402
from test_pipeline_zoneout import SEED, V, _model  # noqa: E402

out, kind = sys.argv[1], sys.argv[2]
T, B, K, M = (int(a) for a in sys.argv[3:7])
torch.set_num_threads(1)
mesh = pdist.init_mesh(pp=2, timeout=60)
if kind == "zoneout":  # units: embedding, layer 0 | layer 1, decoder
    model, vocab, classes, balance = _model("lstm"), V, V, [2, 2]
elif kind == "weight":  # the same units
    torch.manual_seed(1)
    model, vocab, classes, balance = weight_dropped_model(V), V, V, [2, 2]
else:  # units: embedding, its dropout, layer 0 | the dropout between, layer 1, the output's dropout, decoder
    torch.manual_seed(1)
    model, vocab, classes, balance = _variational_model(), 37, 5, [3, 4]
pipe = pdist.PipelineParallel(model, mesh, chunks=K, micro_batches=M, balance=balance, threads=1,
                              carry_state=False, loss_fn=nn.CrossEntropyLoss())
g = torch.Generator().manual_seed(5)
x, y = torch.randint(0, vocab, (T, B), generator=g), torch.randint(0, classes, (T, B), generator=g)
torch.manual_seed(SEED)
loss = pipe.train_step(x, y)
grads = {name: p.grad for name, p in pipe.named_stage_parameters()}
torch.save(dict(loss=loss, grads=grads, x=x, y=y), os.path.join(out, f"rank{mesh.rank}.pt"))
