"""docs/api.md is the API reference generated from the docstrings
(`python -m pipelstm._apidoc`): every public name (what the ``__all__`` of
pipelstm and its public modules lists) has a docstring and a heading, with
its real signature, internals have none, and the file is what the generator
writes now.
"""

import inspect
import os
import re
import types
from typing import Protocol

import torch

import pipelstm
from pipelstm import _apidoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API = os.path.join(ROOT, "docs", "api.md")


def _fake_module():
    mod = types.ModuleType("fake", "A module for the test.")

    def documented(x: int) -> int:
        """Returns x."""
        return x

    def undocumented():
        return None

    class Thing:
        """A class."""

        def method(self, y):
            return y

        @property
        def size(self) -> int:
            """Its size."""
            return 1

    mod.documented, mod.undocumented, mod.Thing = documented, undocumented, Thing
    mod.__all__ = ["documented", "undocumented", "Thing"]
    return mod


def test_every_public_name_has_a_docstring():
    assert _apidoc.missing_docstrings() == []


def test_api_md_is_what_the_generator_writes():
    assert os.path.exists(API), "docs/api.md is missing: run `python -m pipelstm._apidoc`"
    with open(API) as f:
        assert f.read() == _apidoc.render(), "docs/api.md is stale: run `python -m pipelstm._apidoc`"


def _headings():
    with open(API) as f:
        return [line for line in f.read().splitlines() if line.startswith("#")]


def test_lstm_signature_is_nn_lstms_then_the_pipeline_keywords():
    params = list(inspect.signature(pipelstm.LSTM).parameters.values())
    assert [(p.name, p.default) for p in params[:10]] == [
        ("input_size", inspect.Parameter.empty), ("hidden_size", inspect.Parameter.empty), ("num_layers", 1),
        ("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False), ("proj_size", 0),
        ("device", None), ("dtype", None)]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:10])
    assert [p.name for p in params[10:]] == ["devices", "chunks", "micro_batches", "balance", "threads", "checkpoint",
                                             "weight_dropout", "dropout_mode", "zoneout"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[10:])
    heading = next(h for h in _headings() if h.startswith("### `pipelstm.LSTM("))
    assert heading.startswith("### `pipelstm.LSTM(input_size: int, hidden_size: int, num_layers: int = 1, ")
    assert "*args" not in heading and "**kwargs" not in heading and ", *, devices: " in heading


def test_lstm_takes_nn_lstms_arguments_by_position_as_before():
    ours, ref = pipelstm.LSTM(3, 4, 2, False, True, 0.0, False, 2), torch.nn.LSTM(3, 4, 2, False, True, 0.0, False, 2)
    assert (ours.num_layers, ours.bias, ours.batch_first, ours.proj_size) == (2, False, True, 2)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}


def test_internals_are_not_documented():
    with open(API) as f:
        text = f.read()
    for name in ("Mesh.waiting_for", "PipelineCore.connect", "Unit.spec", "pipelstm.pipeline"):
        assert name not in text, name
    headings = _headings()
    for name in ("PipelineCore", "LSTMPipeline", "Unit", "partition", "Plan", "PipelineParallel.core"):
        assert not any(re.search(rf"[`.]{re.escape(name)}(?!\w)", h) for h in headings), name
    for cls, names in _apidoc.INTERNAL_MEMBERS.items():
        for name in names:
            assert f"#### `{cls.rsplit('.', 1)[1]}.{name}" not in text, f"{cls}.{name}"
    assert _apidoc.unknown_internal_members() == []


def test_every_public_name_has_a_heading():
    with open(API) as f:
        text = f.read()
    for mod in _apidoc.public_modules():
        assert f"## {mod.__name__}\n" in text
        for name in getattr(mod, "__all__", []):
            assert f"### `{mod.__name__}.{name}" in text, f"{mod.__name__}.{name}"
    assert set(pipelstm.__all__) <= {n for n in dir(pipelstm)}


def test_generator_finds_missing_docstrings_and_new_names():
    mod = _fake_module()
    assert _apidoc.missing_docstrings([mod]) == ["fake.undocumented", "fake.Thing.method"]
    text = _apidoc.render([mod])
    for expected in ("## fake", "A module for the test.", "### `fake.documented(x: int) -> int`", "Returns x.",
                     "### `fake.undocumented()`", "_No docstring._", "#### `Thing.method(y)`",
                     "#### `Thing.size`", "Its size."):
        assert expected in text, expected


def test_internal_members_and_protocols(monkeypatch):
    mod = _fake_module()

    class Costs(Protocol):
        """A protocol."""

    mod.Costs = Costs
    mod.__all__.append("Costs")
    monkeypatch.setitem(_apidoc.INTERNAL_MEMBERS, f"{__name__}._fake_module.<locals>.Thing", ("method",))
    assert _apidoc.missing_docstrings([mod]) == ["fake.undocumented"]  # an internal member needs none
    text = _apidoc.render([mod])
    assert "Thing.method" not in text and "#### `Thing.size`" in text
    assert "### `fake.Costs`\n" in text  # implemented, not called: no signature
    monkeypatch.setattr(_apidoc, "INTERNAL_MEMBERS", {"pipelstm.distributed.mesh.Mesh": ("shard", "no_such_method"),
                                                      "pipelstm.distributed.NoSuchClass": ("x",)})
    assert _apidoc.unknown_internal_members() == ["pipelstm.distributed.mesh.Mesh.no_such_method",
                                                  "pipelstm.distributed.NoSuchClass"]


def test_check_fails_on_a_stale_or_missing_file(tmp_path, capsys):
    out = tmp_path / "api.md"
    assert _apidoc.main(["--out", str(out), "--check"]) == 1  # missing
    assert not out.exists()  # --check writes nothing
    assert _apidoc.main(["--out", str(out)]) == 0 and out.read_text() == _apidoc.render()
    assert _apidoc.main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("## pipelstm.ops", "## pipelstm.opz"))  # edited by hand
    assert _apidoc.main(["--out", str(out), "--check"]) == 1
    assert "not what the docstrings give" in capsys.readouterr().err


def test_docstrings_become_markdown():
    doc = ("Does it.\n\nArgs:\n    x (int): the input,\n        on two lines.\n    ``y``: other.\n\n"
           "Returns:\n    The :class:`torch.Tensor`.\n\nAfter.")
    text = _apidoc._markdown(doc)
    assert "**Args:**" in text and "- `x` (int): the input, on two lines." in text
    assert "**Returns:**" in text and "The `torch.Tensor`." in text and text.endswith("After.")
