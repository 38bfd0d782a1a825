"""pipelstm/distributed/parallel.py: PipelineParallel's stages in processes
of their own (pipelstm.bench.groups.Group, gloo), one training step."""

import sys

import pytest
import torch.distributed as dist

from pipelstm.bench.distributed import setup_pipelstm
from pipelstm.bench.groups import Group

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


class _ModulesLoaded:
    """A stage's training step, and the Python modules its first step loaded."""

    def __init__(self, rank: int, world: int) -> None:
        self.stage = setup_pipelstm(rank, world, chunks=2, micro_batches=1, quick=True)
        self.loaded = None

    def step(self) -> None:
        before = set(sys.modules)
        self.stage.step()
        if self.loaded is None:
            self.loaded = sorted(set(sys.modules) - before)

    def info(self) -> dict:
        return dict(loaded=self.loaded)


def setup_modules_loaded(rank: int, world: int) -> _ModulesLoaded:
    return _ModulesLoaded(rank, world)


def test_a_stage_step_loads_no_python_modules():
    # A stage that is not the last started backward from its placeholder
    # output with an explicit gradient, which torch checks with torch.fx's
    # symbolic shapes: 484 modules (sympy, mpmath) on the first step, 35 MiB
    # resident in that process, more than the stage keeps for backward.
    with Group("pp=2", 2, setup_modules_loaded, timeout=300) as g:
        g.step()
        assert [r["loaded"] for r in g.last] == [[], []]
