"""The pipeline simulator: the schedule it plays is the engine's, its timing
rules give the textbook bubble and the link's costs, and bad arguments get
clear errors. (Calibration: test_simulator_calibrate.py.)"""

import json
from dataclasses import dataclass, replace

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.simulator import Cluster, Layout, Link, UnitInfo, predict
from pipelstm.simulator.schedule import item_grid, item_order, join_runs

FREE = Link(0.0, float("inf"))


def cluster(intra=FREE, inter=FREE, nodes=1, per_node=8, device="gpu"):
    return Cluster(nodes, per_node, device, 80e9, FREE, intra, inter)


@dataclass
class EqualCosts:
    """Every unit costs the same per item (forward f, backward b), whatever its size."""

    n: int
    f: float = 1.0
    b: float = 2.0
    w: float = 0.0
    out: float = 1000.0
    params: int = 4000
    device: str = "gpu"
    loss: bool = False  # the last unit is the loss (no parameters)

    def units(self):
        units = [UnitInfo(f"u{i}", "linear", self.params) for i in range(self.n)]
        return units[:-1] + [UnitInfo("loss", "cross_entropy", 0)] if self.loss else units

    def seconds(self, unit, phase, t, b):
        return {"forward": self.f, "backward": self.b, "weights": self.w}[phase]

    def output_bytes(self, unit, t, b):
        return self.out

    def saved_bytes(self, unit, t, b):
        return 10.0 * t * b


def order_by_stage(events, phases):
    """Per (stage, phase), the (m, k) items in the order they ran."""
    out = {}
    for e in sorted(events, key=lambda e: e["start_ns"]):
        if e["phase"] in phases:
            out.setdefault((e["stage"], e["phase"]), []).append((e["micro_batch"], e["chunk"]))
    return out


@pytest.mark.parametrize("checkpoint", ["never", "except_last"])
def test_played_order_is_the_engines_trace_order(checkpoint):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(30, 8), pipelstm.LSTM(8, 16, num_layers=2), nn.Linear(16, 30))
    K, M = 3, 2
    pipe = pipelstm.Pipeline(model, ["cpu", "cpu"], chunks=K, micro_batches=M, balance=[2, 2], threads=1,
                             checkpoint=checkpoint, loss_fn=nn.CrossEntropyLoss())
    x, target = torch.randint(0, 30, (9, 4)), torch.randint(0, 30, (9, 4))
    loss, _ = pipe(x, target=target)
    loss.backward()
    layout = Layout(1, 2, [2, 3], K, M, checkpoint=checkpoint, in_process=True)
    p = predict(EqualCosts(5, device="cpu", loss=True), layout, cluster(device="cpu"), 9, 4)
    phases = ("forward", "backward", "recompute")
    assert order_by_stage(p.events, phases) == order_by_stage(pipe.trace(), phases)
    assert any(e["phase"] == "recompute" for e in p.events) == (checkpoint != "never")
    # every stage's parameter gradients: one task per unit with parameters
    assert sum(e["phase"] == "weights" for e in p.events) == sum(e["phase"] == "weights" for e in pipe.trace())


@pytest.mark.parametrize("S,K,M", [(2, 1, 1), (3, 2, 2), (4, 4, 2), (2, 8, 1)])
def test_equal_costs_give_the_textbook_bubble(S, K, M):
    p = predict(EqualCosts(S), Layout(1, S, [1] * S, K, M), cluster(), 64, 16)
    assert p.bubble == pytest.approx((S - 1) / (K * M + S - 1), abs=1e-9)
    assert p.forward_s == pytest.approx((K * M + S - 1) * 1.0)
    assert p.backward_s == pytest.approx((K * M + S - 1) * 2.0)


def test_a_links_latency_and_bandwidth_move_the_step_as_the_link_says():
    costs = EqualCosts(2, out=1e6)
    layout = Layout(1, 2, [1, 1], 1, 1)
    base = predict(costs, layout, cluster(), 8, 8).step_s
    slow = Link(0.5, 1e6)  # one item's activations: 0.5 + 1 s, each way; then the loss's 8 bytes to stage 0
    expected = base + 2 * 1.5 + slow.seconds(8)
    assert predict(costs, layout, cluster(intra=slow), 8, 8).step_s == pytest.approx(expected)
    # the two stages on two nodes: the inter-node link counts, not the intra-node one
    two_nodes = cluster(intra=FREE, inter=slow, nodes=2, per_node=1)
    assert predict(costs, layout, two_nodes, 8, 8).step_s == pytest.approx(expected)


def test_the_allreduce_follows_the_backward_and_costs_what_the_cluster_says():
    costs = EqualCosts(2, params=8_000_000)
    ring = Link(1e-3, 1e9)
    c = cluster(intra=ring, per_node=4)
    one = predict(costs, Layout(1, 2, [1, 1], 2, 2), c, 8, 8)
    two = predict(costs, Layout(2, 2, [1, 1], 2, 2), c, 16, 8)  # the same per-replica batch
    expected = c.allreduce_seconds([0, 2], 8_000_000)  # a stage's replicas: ranks s and pp + s
    assert two.allreduce_s == pytest.approx(expected)
    assert two.step_s - one.step_s == pytest.approx(expected + c.allreduce_seconds([0, 2], 8) + 0.0, rel=1e-6)


def test_ddps_gradient_handling_comes_with_the_allreduce_of_replicas_only():
    costs = EqualCosts(2, params=8_000_000)
    handling = Link(2e-3, 1e9)
    c = cluster(intra=Link(1e-3, 1e9), per_node=4)
    handled = replace(c, gradient_handling=handling)
    assert handled.gradient_seconds(1, 8e6) == 0.0 and c.gradient_seconds(2, 8e6) == 0.0
    layout = Layout(2, 2, [1, 1], 2, 2)
    without, with_it = (predict(costs, layout, x, 16, 8) for x in (c, handled))
    assert with_it.allreduce_s - without.allreduce_s == pytest.approx(handling.seconds(8_000_000))
    assert with_it.step_s - without.step_s == pytest.approx(handling.seconds(8_000_000))
    one = Layout(1, 2, [1, 1], 2, 2)  # one replica: no DDP
    assert predict(costs, one, handled, 8, 8).step_s == predict(costs, one, c, 8, 8).step_s


def test_cpu_stages_of_one_process_share_their_weight_tasks():
    @dataclass
    class HeavyLast(EqualCosts):
        def seconds(self, unit, phase, t, b):
            return 5.0 if phase == "weights" and unit >= 2 else super().seconds(unit, phase, t, b)

    costs = HeavyLast(4, device="cpu", w=0.1)
    cpu = cluster(device="cpu")
    shared = predict(costs, Layout(1, 2, [2, 2], 1, 1, in_process=True), cpu, 8, 8)
    alone = predict(costs, Layout(1, 2, [2, 2], 1, 1, in_process=False), cpu, 8, 8)
    on_stage0 = [e for e in shared.events if e["phase"] == "weights" and e["stage"] == 0]
    assert len(on_stage0) == 3  # its own two, then one of stage 1's
    assert shared.step_s < alone.step_s


def test_memory_counts_kept_items_and_the_backwards_pieces():
    costs = EqualCosts(2, out=10.0, params=100)  # inputs smaller than what the forward keeps
    never = predict(costs, Layout(1, 2, [1, 1], 4, 2), cluster(), 8, 8)
    always = predict(costs, Layout(1, 2, [1, 1], 4, 2, checkpoint="always"), cluster(), 8, 8)
    items = 8 * (10.0 * 2 * 4)  # every item's saved activations (items of 2 x 4)
    pieces = 8 * (10.0 * 2 * 4 + 10.0)  # what the backward keeps for the parameter gradients
    assert never.stage_peak_bytes[0] >= 100 + items
    assert never.stage_peak_bytes[0] >= 100 + pieces
    # recomputation keeps less in the forward, but the backward's pieces are the same
    # (with, while an item is replayed, the stage's input of 10 bytes on top)
    assert always.stage_peak_bytes == pytest.approx(never.stage_peak_bytes, abs=10.0)


def test_item_grid_and_order_are_the_engines():
    assert item_grid(10, 3, 4, 2) == (4, 2, [3, 3, 2, 2], [2, 1])  # tensor_split: the first pieces longer
    assert item_grid(2, 3, 4, 8) == (2, 3, [1, 1], [1, 1, 1])  # clamped to T and B
    assert item_order("forward", 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert item_order("backward", 2, 2) == [(1, 1), (0, 1), (1, 0), (0, 0)]


def test_the_timeline_draws_a_prediction(tmp_path):
    p = predict(EqualCosts(2), Layout(1, 2, [1, 1], 2, 2), cluster(intra=Link(0.1, 1e9)), 8, 8)
    path = str(tmp_path / "predicted.json")
    out = p.timeline(path)
    assert out["json"] == path
    assert out["theoretical_bubble"] == pytest.approx(1 / 5)
    with open(path) as f:
        drawn = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e["cat"] != "idle"]
    assert len(drawn) == len(p.events)
    assert {e["cat"] for e in drawn} == {"forward", "backward", "transfer", "weights"}


@pytest.mark.parametrize("change,match", [
    (dict(balance=[1, 1]), "layout.balance"),
    (dict(pp=2), "layout.balance"),
    (dict(balance=[2, 0, 1]), "layout.balance"),
    (dict(chunks=0), "layout.chunks"),
    (dict(checkpoint="sometimes"), "layout.checkpoint"),
    (dict(dp=4, pp=3, balance=[1, 1, 1]), "9 ranks|12 ranks|cluster has"),
])
def test_bad_layouts_are_named(change, match):
    layout = replace(Layout(1, 3, [1, 1, 1], 2, 2), **change)
    with pytest.raises(ValueError, match=match):
        predict(EqualCosts(3), layout, cluster(per_node=8), 8, 8)


def test_bad_arguments_are_named():
    layout, c = Layout(1, 2, [1, 1], 2, 2), cluster()
    with pytest.raises(ValueError, match="T must be a positive int"):
        predict(EqualCosts(2), layout, c, 0, 8)
    with pytest.raises(ValueError, match="B=7 .* multiple of layout.dp=2"):
        predict(EqualCosts(2), replace(layout, dp=2), c, 8, 7)
    with pytest.raises(TypeError, match="costs must be UnitCosts"):
        predict(object(), layout, c, 8, 8)
    with pytest.raises(TypeError, match="layout must be"):
        predict(EqualCosts(2), (1, 2), c, 8, 8)
    with pytest.raises(TypeError, match="cluster must be"):
        predict(EqualCosts(2), layout, "8xH100", 8, 8)
    with pytest.raises(RuntimeError, match="direction 'forward' or 'backward'"):
        item_order("sideways", 2, 2)


def test_an_lstm_units_weight_task_holds_its_joined_chunks():
    @dataclass
    class LstmCosts(EqualCosts):
        kind: str = "lstm"

        def units(self):
            return [UnitInfo(f"u{i}", self.kind, self.params) for i in range(self.n)]

    assert join_runs([16] * 4) == [(0, 4)] and join_runs([600, 600, 600]) == [(0, 2), (2, 3)]
    assert join_runs([-1, 5, 5]) == [(1, 3)]  # a chunk without a piece ends a run
    layout = Layout(1, 1, [1], 4, 1)  # 4 chunks of 2 x 8 = 16 rows: one run, joined
    lstm = predict(LstmCosts(1, params=100, w=1.0), layout, cluster(), 8, 8)
    linear = predict(LstmCosts(1, params=100, w=1.0, kind="linear"), layout, cluster(), 8, 8)
    pieces = 4 * (10.0 * 2 * 8 + 1000.0)  # each chunk's piece: what its forward kept, and its output's gradient
    # at the start of the weight task: the parameters, every piece, and their joined copy
    assert lstm.stage_peak_bytes[0] == pytest.approx(100 + 2 * pieces)
    assert linear.stage_peak_bytes[0] < lstm.stage_peak_bytes[0]
    one_chunk = Layout(1, 1, [1], 1, 1)  # nothing to join
    assert predict(LstmCosts(1, params=100, w=1.0), one_chunk, cluster(), 8, 8).stage_peak_bytes == \
        predict(LstmCosts(1, params=100, w=1.0, kind="linear"), one_chunk, cluster(), 8, 8).stage_peak_bytes
