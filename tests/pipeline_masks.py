"""The dropout masks a pipelined pass draws, and the unsplit model run with them.

A pipeline does not draw an unsplit run's masks: each pass takes one seed
from the default CPU generator and every (dropout unit, micro-batch, chunk)
seeds its own generator from it (docs/design/pipeline.md, "Exactness"). So a mask
depends on the pass's seed, the unit's place in the model and the pieces
(K time chunks, M micro-batches), not on the stages or the units before it.

``pipeline_masks`` reads them from the pipeline itself: for each dropout
unit, a probe pipeline with a dropout at the same place, fed ones, run with
the same seed, K and M, returns exactly the mask. ``run_masked`` is the
unsplit model (plain-torch LSTM layers from ``reference.layer``) with each
dropout replaced by the product with its mask, ``run_masked_layers`` a
stacked ``nn.LSTM`` run layer by layer the same way, so the pipeline's
gradients can be checked against plain autograd through the same masks.
(Were the probe's masks not the pass's, the outputs would already differ.)
"""

from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

import pipelstm
from pipelstm.pipeline import PipelineCore

from reference import layer

__all__ = ["pipeline_masks", "run_masked", "run_masked_layers"]


def _probe(position: int, p: float, width: int, index_input: bool, in_features: int,
           dtype: torch.dtype, variational: bool = False) -> nn.Sequential:
    """Units that turn the input into ones of ``width`` features, with a
    dropout of ``p`` (per sequence if ``variational``) as unit ``position``
    (the probe's output is its mask)."""
    dropout = pipelstm.LockedDropout(p) if variational else nn.Dropout(p)
    if position == 0:  # the dropout sees the input itself (fed ones)
        return nn.Sequential(dropout)
    if index_input:
        first = nn.Embedding(1, width).to(dtype)
        nn.init.ones_(first.weight)
    else:
        first = nn.Linear(in_features, width).to(dtype)
        nn.init.zeros_(first.weight)
        nn.init.ones_(first.bias)
    fill = [nn.ReLU() for _ in range(position - 1)]  # relu(1) = 1: placeholders for the units before
    return nn.Sequential(first, *fill, dropout)


def pipeline_masks(core: PipelineCore, x: Tensor, seed: int) -> Dict[str, Tensor]:
    """The mask (time-major ``[T, B, F]``, values 0 and 1/(1-p)) each dropout
    unit of ``core`` (of a Pipeline or ``pipelstm.LSTM(devices=...)``) draws in
    a training pass over time-major input ``x`` after
    ``torch.manual_seed(seed)``; keyed by unit name."""
    index_input = not x.is_floating_point()
    dtype = torch.float64 if index_input else x.dtype
    for u in core.units:
        ps = [t for t in u.params() if t is not None]
        if ps:
            dtype = ps[0].dtype
            break
    masks, width = {}, (0 if index_input else x.shape[-1])
    for position, u in enumerate(core.units):
        if not u.is_dropout:
            width = u.out_size
            continue
        probe = pipelstm.Pipeline(_probe(position, u.p, width, index_input, 0 if index_input else x.shape[-1],
                                         dtype, u.kind == "variational_dropout"),
                                  devices=["cpu"], chunks=core.chunks, micro_batches=core.micro_batches, threads=1)
        if position == 0:
            feed = torch.ones_like(x)
        else:
            feed = torch.zeros_like(x) if index_input else x.detach()
        torch.manual_seed(seed)
        with torch.no_grad():
            mask, _ = probe(feed)
        kept = mask[mask != 0]
        assert kept.numel() > 0 and torch.all(kept == kept[0]), f"the probe for {u.name} gave no mask"
        masks[u.name] = mask
    return masks


def run_masked(model: nn.Sequential, x: Tensor, hx: Optional[Tuple[Tensor, Tensor]],
               masks: Dict[str, Tensor]) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """The unsplit time-major model, every dropout the product with its mask,
    every LSTM layer by layer (``reference.layer``); ``output, (h_n, c_n)``
    over all LSTM layers as a Pipeline returns them."""
    hs, cs, first = [], [], 0
    for name, child in model.named_children():
        if isinstance(child, nn.Identity):
            continue
        if isinstance(child, nn.RNNBase):
            assert not child.batch_first
            B = x.shape[1]
            P = child.proj_size or child.hidden_size
            for l in range(child.num_layers):
                w = [getattr(child, f"{n}_l{l}", None) for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh",
                                                                 "weight_hr")]
                h0 = x.new_zeros(B, P) if hx is None else hx[0][first + l]
                c0 = x.new_zeros(B, child.hidden_size) if hx is None else hx[1][first + l]
                x, h, c = layer(x, h0, c0, *w)
                hs.append(h)
                cs.append(c)
                if l < child.num_layers - 1 and child.dropout > 0:
                    x = x * masks[f"{name}.dropout{l}"]
            first += child.num_layers
        elif isinstance(child, (nn.Dropout, pipelstm.LockedDropout)):
            x = x * masks[name]
        else:
            x = child(x)
    return x, (torch.stack(hs), torch.stack(cs))


def run_masked_layers(lstm: nn.LSTM, x: Tensor, hx: Optional[Tuple[Tensor, Tensor]],
                      masks: Sequence[Tensor]) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """A stacked time-major ``nn.LSTM`` as single-layer ``nn.LSTM``s with its
    weights, the product with ``masks[l]`` between layers l and l+1."""
    hs, cs = [], []
    for l in range(lstm.num_layers):
        one = nn.LSTM(x.shape[-1], lstm.hidden_size, proj_size=lstm.proj_size, bias=lstm.bias).to(x.dtype)
        for n in one._flat_weights_names:
            setattr(one, n, getattr(lstm, n.replace("_l0", f"_l{l}")))
        sub = None if hx is None else (hx[0][l : l + 1], hx[1][l : l + 1])
        x, (h, c) = one(x, sub)
        hs.append(h[0])
        cs.append(c[0])
        if l < lstm.num_layers - 1:
            x = x * masks[l]
    return x, (torch.stack(hs), torch.stack(cs))
