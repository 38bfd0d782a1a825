"""``pipelstm.Pipeline``: a sequential LSTM model split into stages on devices.

The model is a ``torch.nn.Sequential`` of ``Embedding``, ``pipelstm.LSTM`` or
``nn.LSTM``, ``Dropout``, ``Linear``, ``LayerNorm``, activations (and
``Identity``); ``units.SUPPORTED`` lists them. It is flattened into
*units* (every layer of a multi-layer LSTM is a unit of its own, and so is
the dropout between two of its layers), and the units are split into
contiguous *stages*, one device each. The C++ engine (``csrc/pipeline``) runs
the stages in one worker thread each, outside the GIL, as a wavefront over
``chunks`` time chunks x ``micro_batches`` micro-batches; ``loss.backward()``
runs the reverse wavefront. See docs/pipeline.md.

All units run natively in C++ (LSTM layers on the fused layer ops,
``Embedding`` as ``at::embedding``, ``Linear`` on the LSTM layers' GEMM
dispatch, ``Dropout`` as a Bernoulli mask; docs/design/pipeline.md has the table),
so the workers never take the GIL.
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from .core import PipelineCore
from .core_settings import core_settings
from .packed import check_packed_input, packed_target, sort_states, unsort_states
from .plan import Plan
from .prologue import prepare

__all__ = ["Pipeline"]


@core_settings(lambda pipe: pipe.core)
class Pipeline(nn.Module):
    """A ``Sequential`` LSTM model pipelined over devices, time chunks and micro-batches.

    Args:
        module: ``nn.Sequential`` of ``Embedding``, ``pipelstm.LSTM``/``nn.LSTM``
            (unidirectional), ``Dropout``, ``Linear`` and ``Identity``. Its
            submodules become this module's (same names, so ``state_dict()`` is
            the unsplit model's), their parameters moved to their stage's device.
        devices: one device per stage, e.g. ``["cpu", "cpu"]`` or ``["cuda:0", "cuda:1"]``.
        chunks: K, the number of time chunks (clamped to the sequence length).
        micro_batches: M, the number of micro-batches (clamped to the batch).
        balance: ``"auto"``, or the number of units per stage, e.g. ``[2, 3]``.
        sample: an input to profile the units on for ``balance="auto"``;
            without one, a FLOP cost model balances.
        threads: intra-op threads per CPU stage (an int or one per stage);
            default: ``torch.get_num_threads()`` shared among the CPU stages.
        checkpoint: activation recomputation, trading compute for memory:
            ``"never"`` keeps every activation backward needs; ``"always"``
            keeps of each (micro-batch, chunk) only the stage's input, the
            LSTM layers' initial states and the dropout masks, and runs its
            forward again just before its backward; ``"except_last"`` does so
            for all but each stage's last item (whose backward comes first).
            Results are bitwise the same; ``saved_activation_bytes`` tells
            what the last forward kept.
        loss_fn: an ``nn.CrossEntropyLoss`` (``ignore_index``, reduction
            ``"mean"`` or ``"sum"``) computed inside the last stage, item by
            item, while the other stages work: ``forward(input, hx,
            target=...)`` then returns the loss (a scalar) instead of the
            logits, and its backward starts from there.

    ``forward(input, hx=None)`` takes ``[T, B]`` indices (first unit an
    Embedding) or ``[T, B, I]`` features (``[B, T, ...]`` when the LSTMs are
    ``batch_first``) and optional ``(h_0, c_0)`` of shape ``[L, B, P]`` and
    ``[L, B, H]`` over all L LSTM layers; it returns ``output, (h_n, c_n)``.
    With ``loss_fn``, ``forward(input, hx=None, target=...)`` takes the
    targets ``[T, B]`` (``[B, T]`` with ``batch_first``) and returns
    ``loss, (h_n, c_n)``.

    ``input`` may also be a ``PackedSequence`` (of indices or features, any
    ``enforce_sorted``): each stage then computes only the sequences' real
    steps (no padding), and the output is a ``PackedSequence`` packed like the
    input, ``h_n``/``c_n`` per sequence in the input's order, as
    ``torch.nn.LSTM``. With ``loss_fn`` the target is a ``PackedSequence``
    packed like the input, or its data ``[N]``.

    The pipeline's :class:`PipelineCore` (``core``) holds the units, the
    stages and the engine; ``balance``, ``chunks``, ``micro_batches``,
    ``threads``, ``checkpoint`` and ``saved_activation_bytes`` are its.
    """

    def __init__(
        self,
        module: nn.Sequential,
        devices: Sequence[Union[str, torch.device]],
        chunks: int = 1,
        micro_batches: int = 1,
        balance: Union[str, Sequence[int]] = "auto",
        sample: Optional[Tensor] = None,
        threads: Union[None, int, Sequence[int]] = None,
        checkpoint: str = "never",
        loss_fn: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Sequential):
            raise ValueError(f"Pipeline: expected an nn.Sequential, got {type(module).__name__}")
        model = prepare("Pipeline", module.named_children(), devices, chunks=chunks, micro_batches=micro_batches,
                        checkpoint=checkpoint, loss_fn=loss_fn, sample=sample, one_layout=True)
        self._batch_first = model.batch_first
        self.core = PipelineCore(model.units, model.devices, balance, threads, chunks=chunks,
                                 micro_batches=micro_batches, checkpoint=checkpoint, loss=model.loss,
                                 sample_shape=model.sample_shape, who="Pipeline")
        for name, child in module.named_children():
            self.add_module(name, child)
        self.training = module.training

    # balance, chunks, micro_batches, threads, checkpoint, saved_activation_bytes:
    # the core's (@core_settings).

    def __getitem__(self, index: int) -> nn.Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    # --- running -----------------------------------------------------------------

    def forward(self, input: Union[Tensor, PackedSequence], hx=None,
                target: Union[None, Tensor, PackedSequence] = None) -> Tuple[Union[Tensor, PackedSequence], tuple]:
        # Every argument is checked here, before any work (pipeline/core.py's checks).
        bf = self._batch_first
        packed = isinstance(input, PackedSequence)
        if packed:
            x, batch_sizes, batch = input.data, input.batch_sizes, int(input.batch_sizes[0])
            check_packed_input(self.core, x, batch_sizes)
            target = packed_target("Pipeline", target, input)
            if (target is None) != (self.core.loss is None):
                self.core.check_target(target, 0, 0)  # raises: a target exactly with a loss_fn
        else:
            x = input.transpose(0, 1) if bf and isinstance(input, Tensor) and input.dim() >= 2 else input
            self.core.check_input(x, bf)
            if bf and isinstance(target, Tensor) and target.dim() == 2:
                target = target.t()
            self.core.check_target(target, x.shape[0], x.shape[1], bf)
            batch_sizes, batch = None, x.shape[1]
        L = self.core.num_layers
        h0: List[Optional[Tensor]] = [None] * L
        c0: List[Optional[Tensor]] = [None] * L
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise ValueError("Pipeline: hx must be a tuple (h_0, c_0)")
            for states, given in ((h0, hx[0]), (c0, hx[1])):
                if len(given) != L:
                    raise ValueError(f"Pipeline: expected initial states for {L} LSTM layers, got {len(given)}")
                for l in range(L):
                    states[l] = given[l]
            self.core.check_states(h0, c0, batch)
        if packed:  # the engine runs the sequences sorted by decreasing length
            h0, c0 = sort_states(h0, input.sorted_indices), sort_states(c0, input.sorted_indices)
        out, h_n, c_n = self.core.run(x, h0, c0, self.training, target, batch_sizes)
        if self._batch_first and target is None and not packed:
            out = out.transpose(0, 1)
        h_n, c_n = self._stack(h_n, out.device), self._stack(c_n, out.device)
        if packed:
            h_n, c_n = self._unsort(h_n, input), self._unsort(c_n, input)
            if target is None:
                out = PackedSequence(out, batch_sizes, input.sorted_indices, input.unsorted_indices)
        return out, (h_n, c_n)

    @staticmethod
    def _unsort(states, seq: PackedSequence):
        if isinstance(states, list):
            return [unsort_states(s.unsqueeze(0), seq.unsorted_indices)[0] for s in states]
        return None if states is None else unsort_states(states, seq.unsorted_indices)

    @staticmethod
    def _stack(states: List[Tensor], device: torch.device):
        if not states:
            return None
        if len({tuple(s.shape) for s in states}) > 1:
            return [s.to(device) for s in states]  # layers of different widths
        return torch.stack([s.to(device) for s in states])

    # --- plan and timeline ---------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The stages: device, units, estimated time, parameters, activation memory."""
        return self.core.plan

    def trace(self) -> List[dict]:
        """What ran in the last forward (and backward): one dict per span."""
        return self.core.trace()

    def timeline(self, path: str) -> Dict[str, object]:
        """Writes the schedule that last ran as a Chrome trace (``path``, JSON;
        open it in chrome://tracing or ui.perfetto.dev) and, if matplotlib is
        installed, a Gantt chart next to it (same name, ``.png``).

        Returns the paths written and the measured bubble (idle fraction of
        the stages over each pass) with the theoretical (S-1)/(K*M+S-1).
        """
        return self.core.timeline(path)

    def extra_repr(self) -> str:
        return self.core.extra_repr()
