"""AWD-LSTM checkpoints with ``nn.LSTM``'s parameter names, for ``pipelstm.LSTM(weight_dropout=...)``.

AWD-LSTM's weight drop keeps the recurrent weight before the drop as a
parameter of its own, ``weight_hh_l0_raw``, and sets the dropped copy on a
wrapped ``nn.LSTM`` before each forward. Its checkpoints therefore name the
LSTM's parameters ``<wrapper>.module.weight_ih_l0`` and the raw weight
either ``<wrapper>.module.weight_hh_l0_raw`` (salesforce/awd-lstm-lm's
``WeightDrop``, which registers it on the LSTM) or
``<wrapper>.weight_hh_l0_raw`` (fastai's ``WeightDropout``, which registers
it on the wrapper, and may also save the dropped copy as
``<wrapper>.module.weight_hh_l0``). ``pipelstm.LSTM`` drops the weight
itself, so a model that holds it where the wrapper was has the plain names:
``<wrapper>.weight_ih_l0``, ``<wrapper>.weight_hh_l0``.
"""

import re
from typing import Dict, Mapping

from torch import Tensor

__all__ = ["awd_state_dict"]

_RAW = re.compile(r"^(?P<owner>.*?)(?P<name>weight_hh_l\d+(?:_reverse)?)_raw$")


def awd_state_dict(state_dict: Mapping[str, Tensor], wrapper_attribute: str = "module") -> Dict[str, Tensor]:
    """An AWD-LSTM checkpoint's ``state_dict`` with the names of a model
    that holds a ``pipelstm.LSTM(weight_dropout=p)`` where each weight-drop
    wrapper was.

    Every raw recurrent weight (``weight_hh_lK_raw``) becomes that LSTM's
    ``weight_hh_lK`` (a dropped copy saved beside it is left out), and the
    wrapper's own level (``module.``) leaves the names of the LSTM's other
    parameters. Keys of the rest of the model are unchanged; so are the
    tensors (not copied).

    Args:
        state_dict: the checkpoint's ``state_dict`` (``torch.load`` of it).
        wrapper_attribute: the attribute under which the wrapper holds the
            LSTM (``"module"`` in AWD-LSTM and fastai).

    Returns:
        A new ``state_dict`` for ``model.load_state_dict``.

    Raises:
        ValueError: a raw weight whose LSTM parameters are not in the
            checkpoint (no ``weight_ih_lK`` beside it), or two keys that
            would get the same name.
    """
    level = f"{wrapper_attribute}."
    wrappers = {}  # the key prefix of each wrapper -> that of the LSTM it holds
    for key in state_dict:
        m = _RAW.match(key)
        if m is None:
            continue
        owner, name = m.group("owner"), m.group("name")
        lstm = owner if owner.endswith(level) else owner + level
        ih = lstm + name.replace("weight_hh", "weight_ih")
        if ih not in state_dict:
            raise ValueError(f"awd_state_dict: {key!r} is a raw recurrent weight, but the checkpoint has no {ih!r} "
                             f"beside it; is {wrapper_attribute!r} the attribute the wrapper holds its LSTM under?")
        wrappers[lstm[: -len(level)]] = lstm
    out: Dict[str, Tensor] = {}
    for key, value in state_dict.items():
        m = _RAW.match(key)
        if m is not None:
            owner = m.group("owner")
            new = (owner[: -len(level)] if owner.endswith(level) else owner) + m.group("name")
        else:
            wrapper = next((w for w, lstm in wrappers.items() if key.startswith(lstm)), None)
            if wrapper is None:
                new = key
            else:
                new = wrapper + key[len(wrappers[wrapper]):]
                if _RAW.match(new + "_raw") and (key + "_raw" in state_dict or new + "_raw" in state_dict):
                    continue  # the dropped copy of a weight whose raw one is saved
        if new in out:
            raise ValueError(f"awd_state_dict: two keys of the checkpoint would both be named {new!r}")
        out[new] = value
    return out
