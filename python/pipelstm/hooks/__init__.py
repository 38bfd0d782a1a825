"""How pipelstm's ops and modules plug into torch's machinery:

* ``fake_kernels``: the ops' fake kernels, for FakeTensor, ``torch.compile``
  and ``torch.export``;
* ``autocast``: what the forward ops do under ``torch.autocast``;
* ``export``: ``nn.LSTM``'s own computation where ONNX export and
  TorchScript need it;
* ``serialization``: pipelstm's modules as safe globals for
  ``torch.load(weights_only=True)``.

``register()`` installs the registrations (pipelstm's import calls it once).
"""

__all__ = ["register"]

_registered = False


def register() -> None:
    """Registers the fake kernels, the autocast rules and the safe globals, once."""
    global _registered
    if _registered:
        return
    from . import autocast, fake_kernels, serialization

    fake_kernels.register()
    autocast.register()
    serialization.register()
    _registered = True
