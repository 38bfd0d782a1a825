"""pipelstm/export.py: models holding pipelstm.LSTM / LSTMCell export as
models holding nn.LSTM / nn.LSTMCell do.

torch.onnx.export with both exporters (dynamo and TorchScript), checked by
running the exported graph in onnxruntime against the eager pipelstm module
(its fused ops) and against nn.LSTM with the same weights; where ONNX has no
form the error is nn.LSTM's (or, for a projection under the dynamo exporter,
a clear one). torch.export + AOTInductor keep the fused ops: the package
loads in a fresh process and matches eager.
"""

import contextlib
import io
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import pipelstm

onnx = pytest.importorskip("onnx", reason="ONNX export tests need onnx (requirements-dev.txt)")
ort = pytest.importorskip("onnxruntime", reason="ONNX export tests need onnxruntime (requirements-dev.txt)")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript (requirements-dev.txt)")

EXPORTERS = ["dynamo", "torchscript"]
I, H, B, T = 3, 4, 2, 5
TOL = dict(atol=1e-5, rtol=1e-4)


class Flat(nn.Module):
    """An LSTM with flat tensor inputs and outputs: (x[, h0, c0]) -> (output, h_n, c_n)."""

    def __init__(self, lstm: nn.Module) -> None:
        super().__init__()
        self.lstm = lstm
        self.eval()  # the TorchScript exporter restores the wrapper's mode, and its children's, afterwards

    def forward(self, x, h0=None, c0=None):
        output, (h, c) = self.lstm(x) if h0 is None else self.lstm(x, (h0, c0))
        return output, h, c


class Packed(nn.Module):
    """A padded batch and its lengths, packed around the LSTM as users write it."""

    def __init__(self, lstm: nn.Module) -> None:
        super().__init__()
        self.lstm = lstm
        self.eval()  # the TorchScript exporter restores the wrapper's mode, and its children's, afterwards

    def forward(self, x, lengths):
        output, (h, c) = self.lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
        return pad_packed_sequence(output)[0], h, c


class Cell(nn.Module):
    def __init__(self, cell: nn.Module) -> None:
        super().__init__()
        self.cell = cell
        self.eval()

    def forward(self, x, h=None, c=None):
        return self.cell(x) if h is None else self.cell(x, (h, c))


def lstm_pair(**kw):
    """(pipelstm.LSTM, nn.LSTM) with the same weights, in eval mode."""
    ours = pipelstm.LSTM(I, H, **kw).eval()
    ref = nn.LSTM(I, H, **kw).eval()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def export(model, args, path, exporter, names=None, dynamic_axes=None):
    """torch.onnx.export with the chosen exporter, quietly; the model's file."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(model, args, str(path), dynamo=True)
        else:
            torch.onnx.export(model, args, str(path), dynamo=False, input_names=names, dynamic_axes=dynamic_axes)
    return path


def run_onnx(path, args):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    assert len(feed) == len(args)
    return [torch.from_numpy(o) for o in session.run(None, feed)]


def assert_matches(path, args, *models):
    """onnxruntime's outputs on args match each eager model's."""
    got = run_onnx(path, args)
    for model in models:
        with torch.no_grad():
            want = model(*args)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOL)


def op_types(path):
    """(op type, domain) of every node of the exported graph, functions included."""
    m = onnx.load(str(path))
    nodes = list(m.graph.node) + [n for f in m.functions for n in f.node]
    return {(n.op_type, n.domain) for n in nodes}


def inputs(kw, with_hx, steps=T, batched=True):
    """(x[, h0, c0]) for an LSTM made with kw; unbatched: x [T, I], h0 and c0 [D, H]."""
    if not batched:
        x = torch.randn(steps, I)
    else:
        x = torch.randn(B, steps, I) if kw.get("batch_first") else torch.randn(steps, B, I)
    if not with_hx:
        return (x,)
    d = (2 if kw.get("bidirectional") else 1) * kw.get("num_layers", 1)
    shape = (d, B) if batched else (d,)
    return x, torch.randn(*shape, kw.get("proj_size") or H), torch.randn(*shape, H)


# (configuration, with (h0, c0)): each exported by both exporters.
DENSE = [
    (dict(), False),
    (dict(), True),
    (dict(batch_first=True), True),
    (dict(bidirectional=True), False),
    (dict(num_layers=2, dropout=0.3), True),
    (dict(num_layers=2, bidirectional=True, batch_first=True, bias=False), False),
]


def dense_id(case):
    kw, with_hx = case
    return (",".join(f"{k}={v}" for k, v in kw.items()) or "default") + ("-hx" if with_hx else "-no_hx")


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kw, with_hx", DENSE, ids=[dense_id(c) for c in DENSE])
def test_dense_lstm_exports_and_onnxruntime_matches_eager(tmp_path, kw, with_hx, exporter):
    ours, ref = lstm_pair(**kw)
    args = inputs(kw, with_hx)
    time_dim = 1 if kw.get("batch_first") else 0
    names = ["x", "h0", "c0"][: len(args)]
    path = export(Flat(ours), args, tmp_path / "m.onnx", exporter, names, {"x": {time_dim: "T"}})
    types = op_types(path)
    assert ("LSTM", "") in types  # ONNX's own LSTM op
    assert not any(domain.startswith("pipelstm") for _, domain in types)
    assert_matches(path, inputs(kw, with_hx), Flat(ours), Flat(ref))  # new values, the traced shapes
    if exporter == "torchscript":
        # The TorchScript exporter keeps the sequence length dynamic (as for nn.LSTM).
        assert_matches(path, inputs(kw, with_hx, steps=T + 4), Flat(ours), Flat(ref))


@pytest.mark.parametrize("exporter, with_hx", [("dynamo", True), ("torchscript", False)])
def test_unbatched_input(tmp_path, exporter, with_hx):
    ours, ref = lstm_pair(num_layers=2)
    args = inputs(dict(num_layers=2), with_hx, batched=False)
    path = export(Flat(ours), args, tmp_path / "m.onnx", exporter, ["x", "h0", "c0"][: len(args)], {"x": {0: "T"}})
    assert_matches(path, inputs(dict(num_layers=2), with_hx, batched=False), Flat(ours), Flat(ref))
    if exporter == "torchscript":
        assert_matches(path, inputs(dict(num_layers=2), with_hx, steps=T + 4, batched=False), Flat(ours), Flat(ref))


@pytest.mark.parametrize("kw", [dict(), dict(num_layers=2, bidirectional=True)], ids=["default", "2-layer-bidir"])
def test_packed_input_exports_with_the_torchscript_exporter(tmp_path, kw):
    ours, ref = lstm_pair(**kw)
    x, lengths = torch.randn(T, 3, I), torch.tensor([T, 2, 4])
    path = export(Packed(ours), (x, lengths), tmp_path / "m.onnx", "torchscript", ["x", "lengths"])
    assert_matches(path, (torch.randn(T, 3, I), torch.tensor([3, T, 1])), Packed(ours), Packed(ref))


def root_cause(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def test_packed_input_under_the_dynamo_exporter_fails_as_nn_lstm_does(tmp_path):
    # torch.export cannot trace nn.LSTM's PackedSequence path (the batch comes
    # from batch_sizes' values): the same error for both.
    ours, ref = lstm_pair()
    args = (torch.randn(T, 3, I), torch.tensor([T, 2, 4]))
    errors = []
    for model in (ref, ours):
        with pytest.raises(Exception) as info:
            export(Packed(model), args, tmp_path / "m.onnx", "dynamo")
        errors.append(root_cause(info.value))
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])


def test_projection_under_the_torchscript_exporter_raises_nn_lstms_error(tmp_path):
    ours, ref = lstm_pair(proj_size=2)
    args = inputs(dict(), False)
    messages = []
    for model in (ref, ours):
        with pytest.raises(Exception, match="LSTMs with projections") as info:
            export(Flat(model), args, tmp_path / "m.onnx", "torchscript")
        messages.append((type(info.value), str(info.value).splitlines()[0]))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("kw, with_hx", [(dict(), False), (dict(num_layers=2, bidirectional=True, batch_first=True), True)],
                         ids=["default-no_hx", "2-layer-bidir-batch_first-hx"])
def test_projection_under_the_dynamo_exporter_is_decomposed(tmp_path, kw, with_hx):
    # ONNX's LSTM op has no projection (torch's translation of nn.LSTM drops
    # it: onnxruntime refuses that file); pipelstm exports torch's step-by-step
    # decomposition instead.
    ours, ref = lstm_pair(proj_size=2, **kw)
    args = inputs(dict(kw, proj_size=2), with_hx)
    path = export(Flat(ours), args, tmp_path / "m.onnx", "dynamo")
    assert ("LSTM", "") not in op_types(path)
    assert_matches(path, inputs(dict(kw, proj_size=2), with_hx), Flat(ours), Flat(ref))


def test_bad_input_under_export_raises_nn_lstms_error(tmp_path):
    ours, ref = lstm_pair()
    bad = (torch.randn(T, B, I + 1),)
    messages = []
    for model in (ref, ours):
        with pytest.raises(RuntimeError) as info:
            export(Flat(model), bad, tmp_path / "m.onnx", "torchscript")
        messages.append(str(root_cause(info.value)))
    assert messages[0] == messages[1] and "input.size(-1) must be equal to input_size" in messages[0]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_pipelined_lstm_exports(tmp_path, exporter):
    # devices=[...] on the CPU: the same parameters, nn.LSTM's path under export.
    ours = pipelstm.LSTM(I, H, num_layers=2, devices=["cpu", "cpu"]).eval()
    ref = nn.LSTM(I, H, num_layers=2).eval()
    ref.load_state_dict(ours.state_dict())
    args = inputs(dict(num_layers=2), True)
    path = export(Flat(ours), args, tmp_path / "m.onnx", exporter, ["x", "h0", "c0"])
    assert_matches(path, inputs(dict(num_layers=2), True), Flat(ours), Flat(ref))


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_exports_with_the_class_swapped_globally(tmp_path, exporter, monkeypatch):
    # torch.nn.LSTM = pipelstm.LSTM: the way to swap the class inside code
    # one does not own. Export must still find torch's own LSTM.
    ref_lstm, ref_cell = nn.LSTM(I, H, num_layers=2).eval(), nn.LSTMCell(I, H)
    monkeypatch.setattr(torch.nn, "LSTM", pipelstm.LSTM)
    monkeypatch.setattr(torch.nn, "LSTMCell", pipelstm.LSTMCell)
    ours = torch.nn.LSTM(I, H, num_layers=2).eval()
    cell = torch.nn.LSTMCell(I, H)
    assert isinstance(ours, pipelstm.LSTM) and isinstance(cell, pipelstm.LSTMCell)
    ref_lstm.load_state_dict(ours.state_dict())
    ref_cell.load_state_dict(cell.state_dict())
    path = export(Flat(ours), inputs(dict(num_layers=2), True), tmp_path / "m.onnx", exporter, ["x", "h0", "c0"])
    assert ("LSTM", "") in op_types(path)
    assert_matches(path, inputs(dict(num_layers=2), True), Flat(ours), Flat(ref_lstm))
    x = (torch.randn(B, I), torch.randn(B, H), torch.randn(B, H))
    path = export(Cell(cell), x, tmp_path / "c.onnx", exporter, ["x", "h", "c"])
    assert not any(domain.startswith("pipelstm") for _, domain in op_types(path))
    assert_matches(path, (torch.randn(B, I), torch.randn(B, H), torch.randn(B, H)), Cell(cell), Cell(ref_cell))


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("batched, with_hx", [(True, True), (True, False), (False, True)],
                         ids=["batched-hx", "batched-no_hx", "unbatched-hx"])
def test_lstm_cell_exports(tmp_path, exporter, with_hx, batched):
    ours = pipelstm.LSTMCell(I, H)
    ref = nn.LSTMCell(I, H)
    ref.load_state_dict(ours.state_dict())
    lead = (B,) if batched else ()

    def args():
        x = torch.randn(*lead, I)
        return (x, torch.randn(*lead, H), torch.randn(*lead, H)) if with_hx else (x,)

    example = args()
    path = export(Cell(ours), example, tmp_path / "m.onnx", exporter, ["x", "h", "c"][: len(example)])
    assert not any(domain.startswith("pipelstm") for _, domain in op_types(path))
    assert_matches(path, args(), Cell(ours), Cell(ref))


def test_eager_forward_keeps_the_fused_ops():
    # The export branch is taken only under torch.onnx.export: torch.export
    # (AOTInductor's input) traces the fused ops.
    ours, _ = lstm_pair()
    graph = torch.export.export(Flat(ours), inputs(dict(), True)).graph
    targets = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert "pipelstm.lstm_layer_forward.default" in targets
    assert "aten.lstm.input" not in targets
    assert not torch.onnx.is_in_onnx_export()


AOTI_RUN = r"""
import sys, torch
import pipelstm  # registers the ops the package calls
runner = torch._inductor.aoti_load_package(sys.argv[1])
cases = torch.load(sys.argv[2])
torch.save([list(runner(*args)) for args in cases], sys.argv[3])
"""


class Tagger(nn.Module):
    """A tiny sequence model: LSTM -> Linear on every step."""

    def __init__(self, lstm_class) -> None:
        super().__init__()
        self.lstm = lstm_class(I, H, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * H, 2)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        return self.out(y), h, c


def test_aoti_package_loads_in_a_fresh_process_and_matches_eager(tmp_path):
    torch.manual_seed(0)
    ours = Tagger(pipelstm.LSTM).eval()
    ref = Tagger(nn.LSTM).eval()
    ref.load_state_dict(ours.state_dict())

    def args(steps):
        return torch.randn(B, steps, I), torch.randn(4, B, H), torch.randn(4, B, H)

    steps = torch.export.Dim("T", min=2, max=64)
    program = torch.export.export(ours, args(T), dynamic_shapes=({1: steps}, None, None))
    assert "pipelstm.lstm_layer_forward.default" in {str(n.target) for n in program.graph.nodes}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "tagger.pt2"))

    cases = [args(T), args(T + 6)]  # a sequence length other than the traced one
    torch.save(cases, tmp_path / "cases.pt")
    subprocess.run([sys.executable, "-c", AOTI_RUN, package, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
                   check=True, timeout=300)
    outputs = torch.load(tmp_path / "out.pt")
    for case, got in zip(cases, outputs):
        with torch.no_grad():
            for model in (ours, ref):
                for g, w in zip(got, model(*case)):
                    torch.testing.assert_close(g, w, **TOL)
