"""pipelstm/pipeline/units.py: what a model flattens into, and the tables of
module types and unit kinds the engine runs."""

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm._C import pipeline as engine
from pipelstm.geometry import LayerGeometry
from pipelstm.pipeline.units import ACTIVATIONS, KINDS, LSTM_KINDS, flatten


@pytest.mark.parametrize(
    "model, message",
    [
        (nn.Sequential(nn.LSTM(3, 4, bidirectional=True)), "bidirectional"),
        (nn.Sequential(nn.GRU(3, 4)), "only LSTMs"),
        (nn.Sequential(nn.LSTM(3, 4), nn.Softplus()), "not supported"),
        (nn.Sequential(nn.LSTM(3, 4), nn.LayerNorm((2, 4))), "over the last dimension"),
        (nn.Sequential(nn.Identity()), "no units"),
    ],
)
def test_unsupported_models_are_rejected(model, message):
    with pytest.raises(ValueError, match=message):
        pipelstm.Pipeline(model, devices=["cpu"])


def test_an_activation_matches_its_exact_type():
    # A subclass may compute anything: the engine's native ReLU would not be it.
    class Shifted(nn.ReLU):
        def forward(self, x):
            return super().forward(x) + 1

    with pytest.raises(ValueError, match=r"module '1' \(Shifted\) computes in its own way \(.*Shifted.forward\)"):
        flatten(nn.Sequential(nn.Linear(2, 2), Shifted()).named_children())

    class Renamed(nn.ReLU):  # nothing redefined, but an activation is matched by its exact type
        pass

    with pytest.raises(ValueError, match=r"module '1' \(Renamed\) is not supported"):
        flatten(nn.Sequential(nn.Linear(2, 2), Renamed()).named_children())


def test_every_kind_and_activation_is_the_engines():
    # Each kind's C++ file registers it as the module loads: every one did,
    # and Python knows each (the loss is the engine's own, from loss_fn).
    assert set(KINDS) | {"cross_entropy"} == set(engine.UnitKind.__members__) == set(engine.UNIT_KINDS)
    assert [k for k, v in engine.UNIT_KINDS.items() if v["is_loss"]] == ["cross_entropy"]
    # The engine's table says each kind's parameter slots and options (units.py reads them).
    assert engine.UNIT_KINDS["lstm"]["slots"] == ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
    assert engine.UNIT_KINDS["embedding"]["options"] == ("padding_idx", "scale_grad_by_freq")
    assert sorted(k for k, v in engine.UNIT_KINDS.items() if v["has_state"]) == sorted(LSTM_KINDS)
    for module_type, name in ACTIVATIONS.items():
        assert name(module_type()) in engine.ACTIVATIONS
    assert ACTIVATIONS[nn.GELU](nn.GELU(approximate="tanh")) == "gelu_tanh"


def test_flatten_names_kinds_widths_and_parameter_slots():
    model = nn.Sequential(nn.Embedding(10, 3), nn.Identity(), pipelstm.LSTM(3, 6, num_layers=2, proj_size=2, dropout=0.5),
                          nn.ReLU(), nn.Linear(2, 4, bias=False), nn.LayerNorm(4), nn.LSTM(4, 5, bias=False))
    units = flatten(model.named_children())
    assert [(u.kind, u.name) for u in units] == [
        ("embedding", "0"), ("lstm", "2.l0"), ("dropout", "2.dropout0"), ("lstm", "2.l1"), ("activation", "3"),
        ("linear", "4"), ("layer_norm", "5"), ("lstm", "6.l0"),
    ]
    assert [u.layer for u in units if u.kind == "lstm"] == [0, 1, 2]  # the state slots, over all LSTMs
    assert [u.out_size for u in units] == [3, 2, 2, 2, 2, 4, 4, 5]
    assert [u.input_size for u in units if u.kind == "lstm"] == [3, 2, 4]
    assert units[1].param_names == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_hr_l0"]
    assert units[-1].param_names == ["weight_ih_l0", "weight_hh_l0", None, None, None]
    assert units[5].param_names == ["weight", None]
    assert units[4].activation == "relu" and units[2].p == 0.5
    assert [u.has_state for u in units] == [u.kind == "lstm" for u in units]
    # The parameter slots are the module's own parameters, in the engine's order.
    assert units[3].params()[0] is model[2].weight_ih_l1 and units[3].num_params() == sum(
        p.numel() for n, p in model[2].named_parameters() if n.endswith("_l1"))


def test_an_lstm_units_cost_reads_the_layer_geometry():
    (u,) = flatten([("", nn.LSTM(3, 6, proj_size=2).double())])
    g = LayerGeometry(3, 6, 2)
    flops, saved = u.cost_per_token()
    assert saved == (g.input_size + g.out_size + g.workspace_width) * 8  # input, output, workspace in float64
    assert flops == 3.0 * (2 * 4 * 6 * (3 + 2) + 2 * 2 * 6 + 20 * 6)


def test_a_units_reference_is_its_module():
    lin = nn.Linear(3, 2)
    (u,) = flatten([("0", lin)])
    x = torch.randn(4, 3)
    assert torch.equal(u.reference()(x), lin(x))


class _ScaledLinear(nn.Linear):  # e.g. a LoRA layer: nn.Linear's parameters, its own forward
    def forward(self, x):
        return 2 * super().forward(x)


class _SquaredLSTM(nn.LSTM):
    def forward(self, x, hx=None):
        return super().forward(x * x, hx)


class _OwnDirection(pipelstm.LSTM):
    def _direction(self, *args, **kwargs):
        return super()._direction(*args, **kwargs)


class _InitOnlyLinear(nn.Linear):
    def __init__(self, n):
        super().__init__(n, n)
        nn.init.eye_(self.weight)


class _PlainLayerNormLSTM(pipelstm.LayerNormLSTM):
    pass


@pytest.mark.parametrize("module, where", [
    (_ScaledLinear(4, 4), "_ScaledLinear.forward"), (_SquaredLSTM(4, 4), "_SquaredLSTM.forward"),
    (_OwnDirection(4, 4), "_OwnDirection._direction"),
])
def test_a_subclass_that_computes_in_its_own_way_is_refused_by_name(module, where):
    # It would otherwise run as the units of the class it derives from, without its code.
    with pytest.raises(ValueError, match=rf"module '1' \({type(module).__name__}\) computes in its own way "
                                         rf"\({where}\)"):
        flatten(nn.Sequential(nn.Linear(4, 4), module).named_children())


def test_a_subclass_that_computes_as_its_base_is_flattened_as_it():
    units = flatten(nn.Sequential(_InitOnlyLinear(4), _PlainLayerNormLSTM(4, 4)).named_children())
    assert [u.kind for u in units] == ["linear", "layernorm_lstm"]


class _Doubled(nn.Module):
    def forward(self, w):
        return 2 * w


def test_a_parametrization_is_seen_through():
    # torch.nn.utils.parametrize wraps the module's class in a class of its
    # own: a Linear stays a Linear, a subclass with its own forward stays refused.
    from torch.nn.utils import parametrize

    plain, own = nn.Linear(4, 4), _ScaledLinear(4, 4)
    for m in (plain, own):
        parametrize.register_parametrization(m, "weight", _Doubled())
    assert [u.kind for u in flatten([("0", plain)])] == ["linear"]
    with pytest.raises(ValueError, match=r"computes in its own way \(_ScaledLinear.forward\)"):
        flatten([("0", own)])
