"""The automatic layout's search (pipelstm.simulator.layout), on hand-made
cost tables and a small stand-in for the simulator, so the search itself is
what is tested: it must return the fastest candidate that fits the memory,
or with a margin the simplest of those predicted within it of the fastest."""

import dataclasses
import itertools

import pytest

from pipelstm.simulator import Cluster, Layout, Link, Prediction, UnitInfo
from pipelstm.simulator.clusters import h100_node
from pipelstm.simulator.layout import choose_layout, complexity, seed_layout, simplest, stage_costs


class TableCosts:
    """Units whose phases cost ``per_token`` seconds per token (t * b) each
    plus ``overhead`` per item; saved activations ``act`` bytes per token."""

    device = "test"

    def __init__(self, per_token, kinds=None, act=1.0, params=1000, overhead=1e-4):
        self.per_token, self.act, self.params, self.overhead = per_token, act, params, overhead
        kinds = kinds or ["lstm"] * len(per_token)
        self._units = [UnitInfo(f"u{i}", k, params) for i, k in enumerate(kinds)]

    def units(self):
        return self._units

    def seconds(self, unit, phase, t, b):
        return self.per_token[unit] * t * b + self.overhead

    def output_bytes(self, unit, t, b):
        return 4.0 * t * b

    def saved_bytes(self, unit, t, b):
        return self.act * t * b


def stand_in_predict(costs, layout, cluster, T, B):
    """A GPipe-like estimate: the slowest stage's item time for each item
    after the first, plus one pass through every stage, plus the weights and
    the all-reduce; memory = parameters + what the forward keeps."""
    K, M, rows = layout.chunks, layout.micro_batches, B // layout.dp
    t, b = -(-T // K), max(rows // M, 1)
    stages, start = [], 0
    for n in layout.balance:
        stages.append(range(start, start + n))
        start += n
    recompute = layout.checkpoint != "never"
    item = [sum(costs.seconds(u, "forward", t, b) * (2 if recompute else 1) + costs.seconds(u, "backward", t, b)
                for u in s) for s in stages]
    weights = [sum(costs.seconds(u, "weights", T, rows) for u in s) for s in stages]
    hop = cluster.intra_node.seconds(4 * t * b) * 2 * (layout.pp - 1)
    body = (K * M - 1) * max(item) + sum(item) + max(weights) + hop
    ar = max(cluster.allreduce_seconds([d * layout.pp + s for d in range(layout.dp)],
                                       sum(costs.params for _ in st)) for s, st in enumerate(stages))
    kept = {"never": K * M, "except_last": 1.0, "always": 0.5}[layout.checkpoint]
    peak = [sum(costs.params + costs.saved_bytes(u, t, b) * kept for u in s) for s in stages]
    busy = sum(item) * K * M
    return Prediction(layout=layout, step_s=body + ar, forward_s=body / 3, backward_s=body * 2 / 3,
                      allreduce_s=ar, bubble=1 - busy / (layout.pp * body), stage_peak_bytes=peak)


def free_links(world, memory=1e12):
    free = Link(0.0, float("inf"))
    return Cluster(nodes=1, devices_per_node=world, device="test", device_memory=memory,
                   same_device=free, intra_node=free, inter_node=free)


def brute_force(costs, cluster, T, B, memory):
    """Every candidate choose_layout may take, predicted; the fastest that fits."""
    best = None
    world = cluster.world_size
    for pp in [p for p in range(1, world + 1) if world % p == 0 and p <= len(costs.units())]:
        dp = world // pp
        for K, M, ck in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), ("never", "except_last", "always")):
            if K > T or M > B // dp:
                continue
            for bal in compositions(len(costs.units()), pp):
                pred = stand_in_predict(costs, Layout(dp, pp, bal, K, M, ck), cluster, T, B)
                if max(pred.stage_peak_bytes) <= memory and (best is None or pred.step_s < best.step_s):
                    best = pred
    return best


def compositions(n, parts):
    for cuts in itertools.combinations(range(1, n), parts - 1):
        yield [b - a for a, b in zip((0,) + cuts, cuts + (n,))]


def test_one_dominant_unit_gets_a_stage_of_its_own():
    # Unit 1 costs as much as the other five together: with 2 stages it is alone.
    costs = TableCosts([1e-6, 5e-6, 1e-6, 1e-6, 1e-6, 1e-6])
    plan = choose_layout(costs, free_links(2), 64, 32, pp=2, predict=stand_in_predict)
    assert list(plan.layout.balance) == [2, 4]
    assert plan.layout.chunks * plan.layout.micro_batches > 1  # free hand-overs: fill the pipeline
    assert "predicted step" in plan.why


def test_picks_the_fastest_candidate():
    # Against every candidate (every balance, not only the cost-split one).
    costs = TableCosts([1e-6, 3e-6, 2e-6, 1e-6], overhead=2e-4)
    cluster = free_links(4)
    plan = choose_layout(costs, cluster, 32, 16, predict=stand_in_predict)
    best = brute_force(costs, cluster, 32, 16, 1e12)
    assert plan.prediction.step_s == pytest.approx(best.step_s, rel=1e-9)


def test_per_item_overhead_favours_few_items():
    # A large fixed cost per item and little work: one item per step.
    costs = TableCosts([1e-9, 1e-9], overhead=1.0)
    plan = choose_layout(costs, free_links(2), 64, 32, predict=stand_in_predict)
    assert (plan.layout.chunks, plan.layout.micro_batches) == (1, 1)


def test_free_links_and_even_work_favour_data_parallelism():
    # No bubble and no all-reduce cost for dp: it beats the pipeline's fill and drain.
    costs = TableCosts([1e-6, 1e-6], overhead=1e-6)
    plan = choose_layout(costs, free_links(2), 64, 32, predict=stand_in_predict)
    assert (plan.layout.dp, plan.layout.pp, plan.layout.chunks, plan.layout.micro_batches) == (2, 1, 1, 1)
    assert "pp=1 beats pp=2 by" in plan.why


def test_recomputes_only_when_the_memory_requires_it():
    costs = TableCosts([1e-6, 1e-6], act=100.0)
    roomy = choose_layout(costs, free_links(2), 64, 32, predict=stand_in_predict)
    assert roomy.layout.checkpoint == "never"
    need = max(roomy.prediction.stage_peak_bytes)
    tight = choose_layout(costs, free_links(2), 64, 32, memory=need / 3, predict=stand_in_predict)
    assert max(tight.prediction.stage_peak_bytes) <= need / 3
    assert tight.prediction.step_s >= roomy.prediction.step_s
    best = brute_force(costs, free_links(2), 64, 32, need / 3)
    assert tight.prediction.step_s == pytest.approx(best.step_s, rel=1e-9)


def test_nothing_fits_names_the_need():
    costs = TableCosts([1e-6, 1e-6], params=10 ** 9)
    with pytest.raises(ValueError, match=r"no layout fits in 0\.50 GiB per device; the smallest needs"):
        choose_layout(costs, free_links(2), 8, 4, memory=2 ** 29, predict=stand_in_predict)


def test_impossible_worlds_and_bad_arguments():
    one_unit = TableCosts([1e-6])
    with pytest.raises(ValueError, match="B=2 sequences"):  # 1 unit: pp = 1, dp = 4 > B
        choose_layout(one_unit, free_links(4), 8, 2, predict=stand_in_predict)
    costs = TableCosts([1e-6, 1e-6])
    with pytest.raises(ValueError, match="pp must be a positive divisor of the world size 4"):
        choose_layout(costs, free_links(4), 8, 8, pp=3, predict=stand_in_predict)
    with pytest.raises(ValueError, match="pp=4 stages but the model has 2 units"):
        choose_layout(costs, free_links(4), 8, 8, pp=4, predict=stand_in_predict)
    with pytest.raises(ValueError, match="T must be a positive int"):
        choose_layout(costs, free_links(2), 0, 8, predict=stand_in_predict)
    with pytest.raises(ValueError, match="chunks must be a non-empty list"):
        choose_layout(costs, free_links(2), 8, 8, chunks=[], predict=stand_in_predict)
    with pytest.raises(ValueError, match="cluster must be a Cluster"):
        choose_layout(costs, "h100", 8, 8, predict=stand_in_predict)


def test_loss_stays_in_the_last_stage():
    costs = TableCosts([1e-6, 1e-6, 1e-6, 1e-7], kinds=["embedding", "lstm", "linear", "cross_entropy"])
    plan = choose_layout(costs, free_links(3), 16, 24, pp=3, predict=stand_in_predict)
    assert list(plan.layout.balance) == [1, 1, 2]
    with pytest.raises(ValueError, match="pp=4 stages but the model has 3 units"):
        choose_layout(costs, free_links(4), 16, 24, pp=4, predict=stand_in_predict)


def test_seed_layout_is_one_lstm_per_stage():
    costs = TableCosts([1e-6] * 6, kinds=["embedding", "lstm", "lstm", "dropout", "linear", "cross_entropy"])
    seed = seed_layout(costs, 8)
    assert (seed.dp, seed.pp, list(seed.balance), seed.chunks, seed.micro_batches) == (4, 2, [2, 4], 1, 1)
    with pytest.raises(ValueError, match="world_size=3 is not a multiple of the 2 LSTM layers"):
        seed_layout(costs, 3)


def test_stage_costs_counts_the_weights_once_per_pass():
    costs = TableCosts([1.0], overhead=1.0)
    # 4 items of 2 x 3: forward + backward (6 + 1) each; the weights once, over 4 x 6.
    assert stage_costs(costs, 2, 3, 2, 2) == [4 * 2 * 7 + 25]


def test_cluster_links_reach_the_search():
    # Slow links between devices: a 2-unit model stays in one stage per device.
    costs = TableCosts([1e-6, 1e-6], params=10 ** 8)
    plan = choose_layout(costs, h100_node(2), 64, 32, predict=stand_in_predict)
    assert plan.layout.pp * plan.layout.dp == 2


def test_replicas_split_the_batch_evenly():
    # B = 3 cannot be split over 2 replicas: only the 2-stage pipeline is left.
    costs = TableCosts([1e-6, 1e-6], overhead=1e-6)
    plan = choose_layout(costs, free_links(2), 16, 3, predict=stand_in_predict)
    assert (plan.layout.dp, plan.layout.pp) == (1, 2)
    fixed = choose_layout(costs, free_links(2), 16, 4, checkpoints=["always"], predict=stand_in_predict)
    assert fixed.layout.checkpoint == "always"
    with pytest.raises(ValueError, match="checkpoints must be a non-empty list of"):
        choose_layout(costs, free_links(2), 16, 4, checkpoints=["sometimes"], predict=stand_in_predict)



def test_search_sizes_are_every_size_the_real_simulator_reads():
    from pipelstm.simulator import predict
    from pipelstm.simulator.clusters import local_machine
    from pipelstm.simulator.layout import search_sizes

    class Recording(TableCosts):
        def seconds(self, unit, phase, t, b):
            asked.add((t, b))
            return super().seconds(unit, phase, t, b)

    asked = set()
    T, B = 10, 6  # uneven items: K = 3 cuts 10 into 4, 3, 3; M = 4 cuts 6 into 2, 2, 1, 1
    choose_layout(Recording([1e-6] * 3, kinds=["lstm", "lstm", "cross_entropy"]), local_machine(2, link=Link(1e-5, 1e9)),
                  T, B, chunks=(1, 3), micro_batches=(1, 4), predict=predict)
    sizes = set(search_sizes(T, B, 2, chunks=(1, 3), micro_batches=(1, 4)))
    assert asked and asked <= sizes, sorted(asked - sizes)
    assert (3, 1) in asked  # the smaller pieces are asked for too


def _predicted(step_s):
    return Prediction(layout=None, step_s=step_s, forward_s=0.0, backward_s=0.0, allreduce_s=0.0, bubble=0.0,
                      stage_peak_bytes=[])


def test_simplest_takes_the_least_complex_layout_within_the_margin():
    piped = (Layout(1, 2, [1, 1], 4, 1), _predicted(1.00))
    replicas = (Layout(2, 1, [2], 1, 1), _predicted(1.06))
    one = (Layout(1, 1, [2], 1, 1, in_process=True), _predicted(1.09))
    assert complexity(one[0]) < complexity(replicas[0]) < complexity(piped[0])
    assert simplest([piped, replicas, one], 0.0) is piped  # no margin: the fastest
    assert simplest([piped, replicas, one], 0.07) is replicas
    assert simplest([piped, replicas, one], 0.10) is one
    with pytest.raises(ValueError, match="margin must be a non-negative"):
        simplest([piped], -0.1)


def test_choose_layout_with_a_margin_prefers_fewer_stages_and_says_so():
    # A pipeline is predicted a little faster than data parallelism: taken with no margin, not with one.
    costs = TableCosts([1e-6, 1e-6], overhead=1e-6)

    def pipeline_ahead(costs, layout, cluster, T, B):
        p = stand_in_predict(costs, layout, cluster, T, B)
        return dataclasses.replace(p, step_s=p.step_s * (0.8 if layout.pp == 2 else 1.0))

    fastest = choose_layout(costs, free_links(2), 64, 32, predict=pipeline_ahead)
    assert fastest.layout.pp == 2
    ratio = choose_layout(costs, free_links(2), 64, 32, pp=1, predict=pipeline_ahead).prediction.step_s / \
        fastest.prediction.step_s
    within = choose_layout(costs, free_links(2), 64, 32, predict=pipeline_ahead, margin=ratio - 1 + 1e-6)
    assert within.layout.pp == 1 and "within the margin" in within.why
    assert choose_layout(costs, free_links(2), 64, 32, predict=pipeline_ahead,
                         margin=ratio - 1 - 1e-6).layout.pp == 2
