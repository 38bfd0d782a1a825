"""``pipelstm.LSTM``: a drop-in ``torch.nn.LSTM`` (``pipelstm.LSTMCell`` is
lstm_cell.py's).

It takes the same arguments, creates the same parameters (names, shapes,
order, initialisation) and accepts the same inputs as ``torch.nn.LSTM``,
and computes with the fused pipelstm ops.

``LSTM`` derives from ``torch.nn.RNNBase`` rather than ``torch.nn.LSTM`` on
purpose: TorchDynamo graph-breaks on every instance of ``nn.LSTM``
(subclasses included), while ``pipelstm.LSTM`` compiles whole.

``LSTM(..., devices=[...])`` runs the stacked layers as a pipeline over
devices, time chunks and micro-batches: it holds a
:class:`pipelstm.pipeline.LSTMPipeline` (pipeline/lstm_stack.py), on the
engine of :class:`pipelstm.Pipeline` (see docs/pipeline.md).
"""

import inspect
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from . import ops
from .hooks import export
from .input_checks import packed_batch
from .lstm_layout import as_given, batched, initial_state
from .pipeline import LSTMPipeline, PipelineCore, Plan
from .regularisation import Regularisation
from .stack.graph import call_key, graphed_stack
from .stack.route import stack_route
from .stack.wavefront import run_wavefront
from .pipeline.core_settings import core_settings
from .lstm_cell import LSTMCell  # noqa: F401  (its home before lstm_cell.py: pickles name pipelstm.lstm.LSTMCell)

__all__ = ["LSTM", "LSTMCell"]

_State = Tuple[Tensor, Tensor]


def _pipeline_core(lstm: "LSTM") -> PipelineCore:
    """The core of ``LSTM(devices=...)``; an ordinary LSTM has none, nor its settings."""
    if lstm._pipeline is None:
        raise AttributeError("only an LSTM constructed with devices=[...] has a pipeline and its settings")
    return lstm._pipeline.core


def _with_nn_lstm_arguments(init):
    """Gives ``init`` (``def __init__(self, *args, <keyword-only>, **kwargs)``)
    the signature it accepts: ``nn.LSTM``'s arguments (``RNNBase``'s, less
    ``mode``), then its own keyword-only ones. ``init`` itself is unchanged:
    ``*args, **kwargs`` go to ``RNNBase`` as ``nn.LSTM`` passes them, so a
    call fails exactly where and as ``nn.LSTM``'s would."""
    own = inspect.signature(init)
    torch_args = [p for p in inspect.signature(nn.RNNBase.__init__).parameters.values() if p.name != "mode"]
    keywords = [p for p in own.parameters.values() if p.kind is p.KEYWORD_ONLY]
    init.__signature__ = own.replace(parameters=torch_args + keywords)
    return init


@core_settings(_pipeline_core)
class LSTM(nn.RNNBase):
    """A multi-layer LSTM with the interface of :class:`torch.nn.LSTM`.

    Args: exactly those of :class:`torch.nn.LSTM` (``input_size, hidden_size,
    num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0, device=None, dtype=None``).

    Inputs and outputs: as :class:`torch.nn.LSTM`: ``(T, B, I)``, ``(B, T, I)``
    with ``batch_first``, unbatched ``(T, I)``, or a ``PackedSequence``
    (only the real steps of each sequence are computed), with an optional
    ``(h_0, c_0)``; returns ``output, (h_n, c_n)``.

    Regularisation beyond ``nn.LSTM`` (keyword-only; see
    ``pipelstm.regularisation``):
        weight_dropout: DropConnect on each layer's ``weight_hh``, one mask
            per forward call (AWD-LSTM); training only. Default 0.
        dropout_mode: ``"element"`` (``nn.LSTM``'s ``dropout`` between
            layers, the default) or ``"variational"`` (one mask per
            sequence, the same at every step).
        zoneout: ``p`` or ``(p_c, p_h)``: each unit of each step's cell
            (hidden) state keeps its previous value with probability
            ``p_c`` (``p_h``) while training; in evaluation the expected
            blend (pipelined, each time chunk draws its own masks). Not
            with ``proj_size``. Default 0.

    Pipelined over devices (keyword-only, after nn.LSTM's arguments):
        devices: one device per pipeline stage, e.g. ``["cpu", "cpu"]`` or
            ``["cuda:0", "cuda:1"]``. Default ``None``: an ordinary LSTM, and
            none of the arguments below may be given.
        chunks: K, time chunks (clamped to the sequence length).
        micro_batches: M, micro-batches (clamped to the batch).
        balance: ``"auto"`` (by a FLOP cost model) or the number of units per
            stage; the units are the layers and, with ``dropout > 0``, the
            dropout between two layers: ``l0, dropout0, l1, ...``.
        threads: intra-op threads per CPU stage (an int or one per stage);
            default ``torch.get_num_threads()`` shared among the CPU stages.
        checkpoint: activation recomputation, ``"never"``, ``"except_last"``
            or ``"always"``, as in :class:`pipelstm.Pipeline`.

    With ``devices`` the layers are split into stages exactly as
    :class:`pipelstm.Pipeline` splits a ``Sequential`` holding this LSTM, and
    each layer's parameters are moved to its stage's device at construction
    (the same ``Parameter`` objects; names and ``state_dict`` are unchanged;
    do not move the module afterwards). The input must be on the first
    stage's device; ``(h_0, c_0)`` may be anywhere; ``output``, ``h_n`` and
    ``c_n`` are on the last stage's device. Gradients flow to the input, the
    initial states and every parameter through the pipelined backward.
    ``bidirectional=True`` is rejected (the reverse direction cannot run in
    time chunks). A ``PackedSequence`` runs without padding: each stage
    computes only the real steps of each sequence. ``plan``, ``trace()`` and
    ``timeline(path)`` are those of :class:`pipelstm.Pipeline`.
    """

    _pipeline: Optional[LSTMPipeline] = None  # set by devices=: the pipelined LSTM
    _regularisation = Regularisation()  # set by the constructor (a model pickled before it has none)
    _exports_as_nn_lstm = True  # ONNX export runs nn.LSTM's own path on these parameters
    _pipeline_unit_kind = "lstm"  # a pipeline's units for its layers (pipeline/units.py)

    @_with_nn_lstm_arguments
    def __init__(
        self,
        *args,
        devices: Optional[Sequence[Union[str, torch.device]]] = None,
        chunks: int = 1,
        micro_batches: int = 1,
        balance: Union[str, Sequence[int]] = "auto",
        threads: Union[None, int, Sequence[int]] = None,
        checkpoint: str = "never",
        weight_dropout: float = 0.0,
        dropout_mode: str = "element",
        zoneout: Union[float, Tuple[float, float]] = 0.0,
        **kwargs,
    ) -> None:
        super().__init__("LSTM", *args, **kwargs)
        self._regularisation = Regularisation(weight_dropout, dropout_mode, zoneout)
        self._regularisation.check_module(self.proj_size)
        if devices is None:
            if (chunks, micro_batches, balance, threads, checkpoint) != (1, 1, "auto", None, "never"):
                raise ValueError("LSTM: chunks, micro_batches, balance, threads and checkpoint only apply with "
                                 "devices=[...]")
            return
        self._pipeline = LSTMPipeline(self, devices, chunks, micro_batches, balance, threads, checkpoint)

    # nn.LSTM's own checks, so that bad input fails with its exact errors.
    get_expected_cell_size = export.TorchLSTM.get_expected_cell_size
    check_forward_args = export.TorchLSTM.check_forward_args
    permute_hidden = export.TorchLSTM.permute_hidden

    def check_input(self, input: Tensor, batch_sizes: Optional[Tensor]) -> None:
        # nn.LSTM checks a PackedSequence's dtype only in its C++ kernel
        # (RuntimeError), a padded input's in Python (ValueError): the same here.
        if (batch_sizes is not None and input.dtype != self._flat_weights[0].dtype
                and not torch._C._is_any_autocast_enabled()):
            raise RuntimeError(f"LSTM: the PackedSequence's data has dtype {input.dtype}, but the weights have "
                               f"{self._flat_weights[0].dtype}; convert it: input.to({self._flat_weights[0].dtype})")
        super().check_input(input, batch_sizes)

    def forward(
        self, input: Union[Tensor, PackedSequence], hx: Optional[_State] = None
    ) -> Tuple[Union[Tensor, PackedSequence], _State]:
        if export.in_onnx_export() and self._exports_as_nn_lstm:  # ONNX has no form for the fused ops
            self._require_plain_recurrence("torch.onnx.export")
            return export.lstm_forward(self, input, hx)
        if self._pipeline is not None:
            return self._forward_pipelined(input, hx)
        packed = isinstance(input, PackedSequence)
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            batch, is_batched = packed_batch(batch_sizes), True
        else:
            batch_sizes, sorted_indices, unsorted_indices = None, None, None
            data, is_batched, batch_dim = batched(self, input)
            batch = data.size(batch_dim)

        hx = initial_state(self, data, batch, hx, is_batched)
        self.check_forward_args(data, hx, batch_sizes)
        self._check_parameters(data)
        hx = self.permute_hidden(hx, sorted_indices)

        if not packed and self.batch_first:
            data = data.transpose(0, 1)
        output, h_n, c_n = self._run_layers(data, batch_sizes, hx)
        if packed:
            return PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices), self.permute_hidden(
                (h_n, c_n), unsorted_indices
            )
        return as_given(self, output, h_n, c_n, is_batched, batch_dim)

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script compiles torch's nn.LSTM on these parameters
        # (export.as_torch_module).
        self._require_plain_recurrence("torch.jit.script")
        return export.as_torch_module(self)

    def _require_plain_recurrence(self, what: str) -> None:
        # Zoneout changes the recurrence in evaluation too: nn.LSTM's would be a different model.
        if self._regularisation.zoned:
            raise RuntimeError(f"LSTM: {what} runs torch's nn.LSTM in place of pipelstm's, which has no zoneout "
                               f"(zoneout={self._regularisation.zoneout}); use torch.export or torch.compile")

    # --- devices=: the layers as a pipeline ------------------------------------
    # balance, chunks, micro_batches, threads, checkpoint, saved_activation_bytes:
    # the pipeline core's (@core_settings).

    def flatten_parameters(self) -> None:
        # cuDNN's flattening would gather all weights into one buffer on one device.
        if self._pipeline is None:
            super().flatten_parameters()

    @property
    def devices(self) -> Optional[List[torch.device]]:
        """The stages' devices (``None`` for an ordinary LSTM)."""
        return None if self._pipeline is None else list(self._pipeline.core.devices)

    @property
    def plan(self) -> Optional[Plan]:
        """The stages: device, threads, units, estimated cost, parameters,
        activation memory (``None`` for an ordinary LSTM)."""
        return None if self._pipeline is None else self._pipeline.core.plan

    def trace(self) -> List[dict]:
        """What ran in the last forward (and backward): one dict per span."""
        return self._require_pipeline("trace()").core.trace()

    def timeline(self, path: str):
        """As :meth:`pipelstm.Pipeline.timeline`: the last pass as a Chrome trace (and a Gantt chart)."""
        return self._require_pipeline("timeline()").core.timeline(path)

    def _require_pipeline(self, what: str) -> LSTMPipeline:
        if self._pipeline is None:
            raise RuntimeError(f"LSTM: {what} is only available for an LSTM constructed with devices=[...]")
        return self._pipeline

    def extra_repr(self) -> str:
        s = super().extra_repr()
        if not self._regularisation.is_plain:
            s += ", " + self._regularisation.extra_repr()
        if self._pipeline is not None:
            s += ", " + self._pipeline.core.extra_repr()
        return s

    def _forward_pipelined(self, input, hx) -> Tuple[Tensor, _State]:
        if isinstance(input, PackedSequence):  # nn.LSTM's checks, then the engine on the packed rows
            data, batch_sizes, sorted_indices, unsorted_indices = input
            h0 = c0 = [None] * self.num_layers
            if hx is None:
                self.check_input(data, batch_sizes)
            else:
                hx = initial_state(self, data, packed_batch(batch_sizes), hx, True)
                self.check_forward_args(data, hx, batch_sizes)
                h0, c0 = list(hx[0].unbind(0)), list(hx[1].unbind(0))
            output, h_n, c_n = self._pipeline.run(data, h0, c0, self.training, packed=input)
            return PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices), (h_n, c_n)
        data, is_batched, batch_dim = batched(self, input)
        L = self.num_layers
        if hx is None:
            self.check_input(data, None)
            h0: List[Optional[Tensor]] = [None] * L
            c0: List[Optional[Tensor]] = [None] * L
        else:
            hx = initial_state(self, data, data.size(batch_dim), hx, is_batched)
            self.check_forward_args(data, hx, None)
            h0, c0 = list(hx[0].unbind(0)), list(hx[1].unbind(0))  # the engine moves each to its layer's device
        x = data.transpose(0, 1) if self.batch_first else data
        output, h_n, c_n = self._pipeline.run(x, h0, c0, self.training)
        return as_given(self, output, h_n, c_n, is_batched, batch_dim)

    # --- pieces of forward ---------------------------------------------------

    def _layer_weights(self, layer: int, reverse: bool) -> List[Optional[Tensor]]:
        """[w_ih, w_hh, b_ih, b_hh, w_hr] of one layer and direction, looked up
        by name each call so parametrizations and functional_call apply."""
        sfx = f"_l{layer}" + ("_reverse" if reverse else "")
        get = lambda name: getattr(self, name + sfx)  # noqa: E731
        biases = [get("bias_ih"), get("bias_hh")] if self.bias else [None, None]
        w_hr = get("weight_hr") if self.proj_size > 0 else None
        return [get("weight_ih"), get("weight_hh"), *biases, w_hr]

    def _stack_weights(self) -> List[Tensor]:
        """Every layer's and direction's weights in order, those present."""
        return [w for layer in range(self.num_layers) for reverse in (False, True)[: 2 if self.bidirectional else 1]
                for w in self._layer_weights(layer, reverse) if w is not None]

    def _check_parameters(self, data: Tensor) -> None:
        # All layers up front, so a bad parameter deep in the stack fails
        # before the first layer has run.
        for w in self._stack_weights():
            if w.device != data.device:
                raise RuntimeError(
                    f"Input and parameter tensors are not at the same device, found input tensor at "
                    f"{data.device} and parameter tensor at {w.device}"
                )

    def _run_layers(self, data: Tensor, batch_sizes: Optional[Tensor], hx: _State) -> Tuple[Tensor, Tensor, Tensor]:
        h0, c0 = hx
        route = stack_route(data, self.num_layers, self.bidirectional, batch_sizes is not None,
                            self._regularisation.layer_by_layer(self.training, self.dropout))
        if route.kind == "stack_graph":  # the whole stack as one CUDA graph each way (stack/graph.py)
            params = self._stack_weights()
            dropout = self.dropout if self.training else 0.0
            key = call_key([data, h0, c0], params, route.chunks, dropout, self.num_layers, self.bidirectional,
                           *route.kernels)
            return graphed_stack(key, lambda x, h, c, *_: self._layers(x, None, h, c, route.chunks),
                                 [data, h0, c0], params)
        return self._layers(data, batch_sizes, h0, c0, route.chunks)

    def _layers(self, data: Tensor, batch_sizes: Optional[Tensor], h0: Tensor, c0: Tensor,
                chunks: int) -> Tuple[Tensor, Tensor, Tensor]:
        """The stack over ``data``: as a wavefront of ``chunks`` time chunks
        (``stack/wavefront.py``), or layer after layer for 0."""
        if chunks:
            output, h_list, c_list = run_wavefront(
                data, list(h0.unbind(0)), list(c0.unbind(0)),
                lambda x, h, c, l: ops.lstm_layer(x, h, c, *self._layer_weights(l, False)), chunks,
                self.dropout, self.training)
            return output, torch.stack(h_list), torch.stack(c_list)
        directions = 2 if self.bidirectional else 1
        h_n: List[Tensor] = []
        c_n: List[Tensor] = []
        x = data
        for layer in range(self.num_layers):
            outputs = []
            for d in range(directions):
                k = layer * directions + d
                out, h, c = self._direction(x, batch_sizes, h0[k], c0[k], layer, d == 1)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            x = outputs[0] if directions == 1 else torch.cat(outputs, dim=-1)
            if layer < self.num_layers - 1:
                x = self._regularisation.between_layers(x, self.dropout, self.training, batch_sizes)
        return x, torch.stack(h_n), torch.stack(c_n)

    def _direction(self, x: Tensor, batch_sizes: Optional[Tensor], h0: Tensor, c0: Tensor, layer: int,
                   reverse: bool) -> Tuple[Tensor, Tensor, Tensor]:
        """One layer and direction over ``x``: the fused op for this call's regularisation and layout."""
        w = self._regularisation.layer_weights(self._layer_weights(layer, reverse), self.training)
        if self._regularisation.zoned:
            keep = self._regularisation.keep_weights((*x.shape[:-1], self.hidden_size), self.training, x)
            return ops.lstm_zoneout_layer(x, batch_sizes, h0, c0, *w[:4], *keep, reverse=reverse)
        if batch_sizes is None:
            return ops.lstm_layer(x, h0, c0, *w, reverse=reverse)
        return ops.lstm_packed_layer(x, batch_sizes, h0, c0, *w, reverse=reverse)
