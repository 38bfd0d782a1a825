"""pipelstm.LSTM wrapped in DistributedDataParallel (one process, gloo): it
trains like the bare module. (pipelstm's own multi-process pipeline:
test_distributed.py.)
"""

import copy

import torch
import torch.distributed as dist
from torch import nn

from lstm_pairs import pair, weighted_loss
from reference import rel_error


def test_ddp_single_process_gloo_trains_like_the_bare_module(tmp_path):
    _, ours = pair()
    bare = copy.deepcopy(ours)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(ours)
        x = torch.randn(5, 2, 4)
        for model in (ddp, bare):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            out, (h, c) = model(x)
            weighted_loss(out, h, c).backward()
            if model is ddp:
                grads = [p.grad.clone() for p in ddp.module.parameters()]
            opt.step()
        for g, p in zip(grads, bare.parameters()):
            assert rel_error(g, p.grad) <= 1e-6
        for p, p_bare in zip(ddp.module.parameters(), bare.parameters()):
            assert rel_error(p, p_bare) <= 1e-6
    finally:
        dist.destroy_process_group()
