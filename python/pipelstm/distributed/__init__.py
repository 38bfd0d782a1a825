"""Hybrid data + pipeline parallel training with ``torchrun``.

    mesh = pipelstm.distributed.init_mesh(pp=2, timeout=60)     # from torchrun's environment
    pipe = pipelstm.distributed.PipelineParallel(model, mesh, chunks=4, micro_batches=2)
    opt = torch.optim.SGD(pipe.parameters(), lr=1.0)             # this stage's parameters
    for x, y in batches:
        loss = pipe.train_step(mesh.shard(x), mesh.shard(y), loss_fn)
        pipelstm.distributed.clip_grad_norm_(pipe.parameters(), 0.25, mesh)
        opt.step(); opt.zero_grad()

See docs/distributed.md.
"""

from .checkpoint import atomic_save, latest_checkpoint, load_checkpoint, save_checkpoint
from .clip import clip_grad_norm_
from .mesh import Mesh, init_mesh
from .parallel import PipelineParallel
from .auto_layout import plan_layout

__all__ = [
    "Mesh", "init_mesh", "plan_layout", "PipelineParallel", "clip_grad_norm_",
    "save_checkpoint", "load_checkpoint", "latest_checkpoint", "atomic_save",
]
