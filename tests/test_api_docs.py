"""docs/api.md is the API reference generated from the docstrings
(`python -m pipelstm._apidoc`): every public name (what the ``__all__`` of
pipelstm and its public modules lists) has a docstring and a heading, and
the file is what the generator writes now.
"""

import os
import types

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
