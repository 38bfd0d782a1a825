"""``core_settings``: the settings of a ``PipelineCore`` shown as the
holding module's own attributes (``Pipeline``, ``LSTM(devices=...)``)."""

from typing import TYPE_CHECKING, Callable, Dict, TypeVar

if TYPE_CHECKING:
    from .core import PipelineCore

__all__ = ["SETTINGS", "core_settings"]

# The core's settings a module holding it shows as its own: name -> doc.
SETTINGS: Dict[str, str] = {
    "balance": "Units per stage.",
    "chunks": "K, the time chunks (clamped to the sequence length).",
    "micro_batches": "M, the micro-batches (clamped to the batch).",
    "threads": "Intra-op threads per stage (0 for accelerators).",
    "checkpoint": "The activation recomputation mode.",
    "saved_activation_bytes": "Bytes of activations the last forward with grad kept for backward.",
}

_Module = TypeVar("_Module", bound=type)


def core_settings(core_of: Callable[[object], "PipelineCore"]) -> Callable[[_Module], _Module]:
    """A class decorator for modules holding a core: each of ``SETTINGS``
    becomes a property of the module that reads and sets the setting of
    the core ``core_of(module)`` (which may raise AttributeError: the
    module has no such attribute)."""

    def setting(name: str, doc: str) -> property:
        return property(lambda self: getattr(core_of(self), name),
                        lambda self, value: setattr(core_of(self), name, value), doc=doc)

    def decorate(cls: _Module) -> _Module:
        for name, doc in SETTINGS.items():
            setattr(cls, name, setting(name, doc))
        return cls

    return decorate
