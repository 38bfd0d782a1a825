"""The attributes of pipelstm.backends' modules: each reads and sets one
run-time switch of the C++ side (csrc/settings.h).

A value set here overrides the switch's environment variable until it is
deleted (``del pipelstm.backends.cpu.gemm``); the C++ side checks it and
raises ValueError, naming the switch and the values it takes, for one it
does not take.
"""

import contextlib
import logging
import os
import types
from typing import Any, Callable, Dict, Iterator

from .. import _C

__all__ = ["Switch", "SwitchModule", "choice", "flag", "file_path", "mebibytes", "chunk_count", "stack_chunks", "tristate"]

logger = logging.getLogger("pipelstm")


class Converter:
    """How one kind of switch value goes between Python and the C++ side's text."""

    def __init__(self, expected: str, to_text: Callable[[Any], str], to_python: Callable[[str], Any]):
        self.expected, self.to_text, self.to_python = expected, to_text, to_python


def choice(*values: str) -> Converter:
    """A value that is one of ``values`` (strings; any case)."""
    return Converter(f"a str, one of {', '.join(values)}", lambda v: v if isinstance(v, str) else None, str)


def _whole(v: Any):
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else None


flag = Converter("True or False", lambda v: ("1" if v else "0") if isinstance(v, bool) else None,
                 lambda t: t == "1")
file_path = Converter('a str (a file path, or "" for none)', lambda v: v if isinstance(v, str) else None, str)
mebibytes = Converter("an int (MiB, 0 or more)", _whole, int)
chunk_count = Converter("an int: 0 (off), or 2 to 4096 time chunks", _whole, int)
stack_chunks = Converter("an int: 0 (off), 1 (the layers one after another), or 2 to 4096 time chunks", _whole, int)
tristate = Converter("True, False or None (the library decides)",
                     lambda v: "auto" if v is None else ("1" if v else "0") if isinstance(v, bool) else None,
                     lambda t: None if t == "auto" else t == "1")


class Switch:
    """A module attribute for the switch whose environment variable is ``env``.

    Reading it gives the switch's value now (set here, else the variable,
    else the default); setting it overrides the variable; deleting it drops
    the override.
    """

    def __init__(self, env: str, kind: Converter, doc: str):
        self.env, self.kind, self.__doc__ = env, kind, doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, module: Any, owner: Any = None) -> Any:
        if module is None:
            return self
        value, _ = _C._get_switch(self.env)
        return self.kind.to_python(value)

    def __set__(self, module: types.ModuleType, value: Any) -> None:
        where = f"{module.__name__}.{self.name}"
        text = self.kind.to_text(value)
        if text is None:
            raise TypeError(f"{where} ({self.env}) must be {self.kind.expected}, got {value!r}")
        before = _before(self.env) if logger.isEnabledFor(logging.INFO) else ""
        try:
            _C._set_switch(self.env, text)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        except RuntimeError as e:  # a switch read once, and already read
            raise RuntimeError(f"{where}: {e}") from None
        logger.info("%s = %r (%s; was %s)", where, value, self.env, before)

    def __delete__(self, module: types.ModuleType) -> None:
        try:
            _C._set_switch(self.env, None)
        except RuntimeError as e:
            raise RuntimeError(f"{module.__name__}.{self.name}: {e}") from None


def _before(env: str) -> str:
    """The switch's value and source, for the log (a variable holding a bad
    value is no reason to refuse a value from Python)."""
    try:
        value, source = _C._get_switch(env)
    except RuntimeError:
        return f"the variable's value {os.environ.get(env)!r}, which it does not take"
    return f"{value}, from {source}"


class SwitchModule(types.ModuleType):
    """A module whose class holds Switch attributes (a module's own
    attributes cannot be properties): ``sys.modules[__name__].__class__``
    is set to a subclass of this."""

    @classmethod
    def switches(cls) -> Dict[str, Switch]:
        """The module's switches by attribute name."""
        return {name: v for klass in cls.__mro__ for name, v in vars(klass).items() if isinstance(v, Switch)}

    def flags(self, **values: Any) -> "contextlib.AbstractContextManager[None]":
        """Sets switches of this module for a ``with`` block and restores them
        after (an override set before comes back; none, if there was none).

        Args:
            **values: attribute name = value, e.g. ``gemm="aten"``.

        Raises:
            AttributeError: a name that is not one of this module's switches.
            TypeError, ValueError: as setting the attribute does.
        """
        switches = type(self).switches()
        unknown = sorted(set(values) - set(switches))
        if unknown:
            raise AttributeError(f"{self.__name__}.flags: no switch named {', '.join(unknown)}; "
                                 f"the switches are {', '.join(sorted(switches))}")
        return _flags(self, switches, values)


@contextlib.contextmanager
def _flags(module: SwitchModule, switches: Dict[str, Switch], values: Dict[str, Any]) -> Iterator[None]:
    saved = {name: _C._get_switch(switches[name].env) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, (value, source) in saved.items():
            _C._set_switch(switches[name].env, value if source == "python" else None)
