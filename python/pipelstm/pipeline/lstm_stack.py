"""``LSTMPipeline``: the pipelined mode of ``pipelstm.LSTM(devices=...)``.

The layers of one stacked LSTM (and, with ``dropout > 0``, the dropout
between two of them: ``l0, dropout0, l1, ...``) are split into stages
exactly as :class:`pipelstm.Pipeline` splits a ``Sequential`` holding the
LSTM, on a :class:`PipelineCore`. ``pipelstm.LSTM`` keeps the interface of
``nn.LSTM`` (argument checks, layouts, unbatched input) and hands this
object the time-major batch.
"""

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from .. import ops
from .core import PipelineCore
from .packed import check_packed_input, sort_states, unsort_states
from .prologue import prepare

__all__ = ["LSTMPipeline"]


class LSTMPipeline:
    """The layers of ``lstm`` as a pipeline over ``devices``; its parameters
    are moved to their stage's device here (the same ``Parameter`` objects).

    Args:
        lstm: the (unidirectional) stacked LSTM whose layers are the units.
        devices, chunks, micro_batches, balance, threads, checkpoint: as
            for :class:`pipelstm.Pipeline` (``balance="auto"`` by the FLOP
            cost model).

    Raises:
        ValueError, TypeError: a bidirectional LSTM, or settings out of range
            (messages starting with ``"LSTM:"``).
    """

    def __init__(self, lstm: nn.RNNBase, devices: Sequence[Union[str, torch.device]], chunks: int = 1,
                 micro_batches: int = 1, balance: Union[str, Sequence[int]] = "auto",
                 threads: Union[None, int, Sequence[int]] = None, checkpoint: str = "never") -> None:
        if lstm.bidirectional:
            raise ValueError(
                "LSTM: bidirectional=True cannot be pipelined with devices=: the reverse direction needs the "
                "end of the sequence before its first step, so it cannot run in time chunks; use a "
                "unidirectional LSTM or drop devices="
            )
        model = prepare("LSTM", [("", lstm)], devices, chunks=chunks, micro_batches=micro_batches,
                        checkpoint=checkpoint)
        self.core = PipelineCore(model.units, model.devices, balance, threads, chunks=chunks,
                                 micro_batches=micro_batches, checkpoint=checkpoint, who="LSTM")

    def run(self, x: Tensor, h0: List[Optional[Tensor]], c0: List[Optional[Tensor]], training: bool,
            packed: Optional[PackedSequence] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """The layers over the time-major batch ``x`` ``[T, B, I]`` on the first
        stage's device, from per-layer initial states (None: zeros, or anywhere
        else: moved to the layer's device).

        Args:
            packed: the PackedSequence ``x`` is the data ``[N, I]`` of, or
                None; its states are in the caller's order, as nn.LSTM's.

        Returns:
            ``output`` ``[T, B, P]`` (packed: ``[N, P]``), ``h_n`` ``[L, B, P]``
            and ``c_n`` ``[L, B, H]``, on the last stage's device.

        Raises:
            RuntimeError: the input is not on the first stage's device, or a
                parameter left its stage's device (the module was moved).
        """
        if packed is not None:
            check_packed_input(self.core, x, packed.batch_sizes, on_device=True)
            self._check_placement(None)
            si = packed.sorted_indices
            output, h_n, c_n = self.core.run(x, sort_states(h0, si), sort_states(c0, si), training, None,
                                             packed.batch_sizes)
        else:
            self._check_placement(x)
            if x.size(1) == 0:  # nothing to pipeline; nn.LSTM returns empty results
                output, h_n, c_n = self._run_empty_batch(x, h0, c0)
            else:
                output, h_n, c_n = self.core.run(x, h0, c0, training)
        dev = output.device
        h_n, c_n = torch.stack([h.to(dev) for h in h_n]), torch.stack([c.to(dev) for c in c_n])
        if packed is not None:
            h_n, c_n = unsort_states(h_n, packed.unsorted_indices), unsort_states(c_n, packed.unsorted_indices)
        return output, h_n, c_n

    def _run_empty_batch(self, x: Tensor, h0: List[Optional[Tensor]], c0: List[Optional[Tensor]]):
        """A batch of no sequences: each layer's op on its stage's device, so
        the results (empty) and their autograd graph are nn.LSTM's."""
        h_n: List[Tensor] = []
        c_n: List[Tensor] = []
        for layer, u in enumerate(u for u in self.core.units if u.kind == "lstm"):
            w = u.params()
            x = x.to(w[0].device)
            h = x.new_zeros(0, u.out_size) if h0[layer] is None else h0[layer].to(x.device)
            c = x.new_zeros(0, u.hidden_size) if c0[layer] is None else c0[layer].to(x.device)
            x, h, c = ops.lstm_layer(x, h, c, *w)
            h_n.append(h)
            c_n.append(c)
        return x, h_n, c_n

    def _check_placement(self, data: Optional[Tensor]) -> None:
        # pipelstm.LSTM ran nn.LSTM's checks of the input; the core's adds its device.
        if data is not None:
            self.core.check_input(data, on_device=True)
        for u in self.core.units:
            for name, p in zip(u.param_names, u.params()):
                if name is not None and p.device != u.device:
                    raise RuntimeError(
                        f"LSTM: parameter {name} is on {p.device}, but its pipeline stage runs on {u.device}; "
                        "with devices=, the constructor places the parameters: do not move the module "
                        "(.to(device), .cuda()) afterwards"
                    )
