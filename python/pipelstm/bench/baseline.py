"""The equal-cores baseline of the pipeline benchmarks.

On a CPU, what a user would run instead of N pipeline stages of one thread
each is the same model as one process with N intra-op threads. This is that
model, :class:`pipelstm.bench.pipelining_peer.LanguageModel` (Embedding ->
LSTM layers -> Linear) built on ``torch.nn.LSTM`` or on ``pipelstm.LSTM``
(the same seed gives the same weights), and its training step: forward,
cross-entropy against the targets (mean over the tokens), backward.
"""

from typing import Dict

import torch
from torch import nn

from ..lstm import LSTM
from .pipelining_peer import SIZES, LanguageModel, loss_fn, make_data

__all__ = ["KINDS", "TrainStep", "setup"]

KINDS: Dict[str, type] = {"nn.LSTM": nn.LSTM, "pipelstm.LSTM": LSTM}


class TrainStep:
    """One training step of the language model at ``threads`` intra-op threads.

    The thread count is set for the step and the caller's restored after it,
    so the step can alternate with work at other thread counts in one process.
    """

    def __init__(self, kind: str, quick: bool, threads: int, seed: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, not {kind!r}")
        s = SIZES[quick]
        torch.manual_seed(seed)
        self.model = LanguageModel(s["vocab"], s["emb"], s["hidden"], s["layers"], lstm=KINDS[kind])
        self.x, self.target = make_data(s["vocab"], s["T"], s["B"], seed)  # target [B, T]
        self.kind, self.threads = kind, threads

    def step(self) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self.model.zero_grad(set_to_none=True)
            loss_fn(self.model(self.x), self.target).backward()
        finally:
            torch.set_num_threads(previous)

    __call__ = step


def setup(rank: int, world: int, kind: str, quick: bool, threads: int, seed: int = 0) -> TrainStep:
    """A :class:`pipelstm.bench.groups.Group` workload: the baseline in a process of its own."""
    if world != 1:
        raise ValueError(f"the baseline is one process, not {world}")
    return TrainStep(kind, quick, threads, seed)
