"""Compute that shares a node's cores (pipelstm.simulator.sharing, and
predict with Cluster.compute_sharing): what runs beside other compute
stretches by the sharing factor, what runs alone does not, and devices
that share nothing (GPUs, 1.0) are predicted as before. Replicas in lock
step (Cluster.replica_wait): a dp > 1 step waits for the slowest replica."""

import math
from dataclasses import replace

import pytest
from test_simulator import FREE, EqualCosts, cluster

from pipelstm.simulator import Cluster, Layout, predict
from pipelstm.simulator.model import expected_max_of_normals
from pipelstm.simulator.sharing import stretches


def ev(stage, phase, start, end):
    return dict(stage=stage, phase=phase, micro_batch=0, chunk=0, start_ns=start, end_ns=end)


def test_stretch_is_the_part_run_beside_another_stage():
    events = [ev(0, "forward", 0, 100), ev(1, "forward", 50, 150),  # stage 0: half of it beside stage 1
              ev(1, "backward", 200, 300), ev(0, "transfer", 100, 400),  # a transfer is no compute
              ev(0, "backward", 400, 500), ev(1, "weights", 400, 450)]  # half of it beside stage 1's weights
    f = stretches(events, 2, node_of=[0, 0], replicas_alongside=[False, False], sharing=1.6)
    assert f[(0, "forward")] == pytest.approx(1.3) and f[(1, "forward")] == pytest.approx(1.3)
    assert f[(1, "backward")] == 1.0  # alone
    assert f[(0, "backward")] == pytest.approx(1.3) and f[(1, "weights")] == pytest.approx(1.6)
    # stages on different nodes share nothing; a replica beside shares everything
    apart = stretches(events, 2, node_of=[0, 1], replicas_alongside=[False, True], sharing=1.6)
    assert apart[(0, "forward")] == 1.0 and apart[(1, "backward")] == pytest.approx(1.6)


def cpu(sharing, per_node=2):
    return replace(cluster(per_node=per_node, device="cpu"), compute_sharing=sharing)


def test_replicas_on_one_node_stretch_all_their_compute():
    costs = EqualCosts(2, device="cpu", params=0)
    layout = Layout(2, 1, [2], 1, 1)
    alone = predict(costs, layout, cpu(1.0), 16, 4).step_s
    shared = predict(costs, layout, cpu(1.5), 16, 4).step_s
    assert shared == pytest.approx(1.5 * alone)
    # one replica per node: nothing shared
    two_nodes = replace(cpu(1.5, per_node=1), nodes=2)
    assert predict(costs, layout, two_nodes, 16, 4).step_s == pytest.approx(alone)


def test_a_pipeline_stretches_only_where_its_stages_overlap():
    costs = EqualCosts(2, device="cpu", params=0)
    sequential = Layout(1, 2, [1, 1], 1, 1)  # one item: the stages never compute at once
    assert predict(costs, sequential, cpu(1.5), 16, 4).step_s == predict(costs, sequential, cpu(1.0), 16, 4).step_s
    pipelined = Layout(1, 2, [1, 1], 4, 1)
    free, shared = (predict(costs, pipelined, cpu(s), 16, 4).step_s for s in (1.0, 1.5))
    assert free < shared < 1.5 * free


def test_compute_sharing_below_one_is_refused():
    with pytest.raises(ValueError, match="compute_sharing must be at least 1.0"):
        Cluster(1, 2, "cpu", 1e9, FREE, FREE, FREE, compute_sharing=0.5)


def test_expected_max_of_normals_matches_its_closed_forms():
    assert expected_max_of_normals(1) == pytest.approx(0.0, abs=1e-9)
    assert expected_max_of_normals(2) == pytest.approx(1 / math.pi ** 0.5, rel=1e-6)
    assert expected_max_of_normals(3) == pytest.approx(1.5 / math.pi ** 0.5, rel=1e-6)


def test_replicas_in_lock_step_wait_for_the_slowest():
    costs = EqualCosts(2, device="cpu", params=0)  # no gradients: no all-reduce, the step is the compute
    c = replace(cpu(1.0, per_node=8), replica_wait=1.2)
    assert c.replica_wait_for(1) == 1.0 and c.replica_wait_for(2) == pytest.approx(1.2)
    assert c.replica_wait_for(2) < c.replica_wait_for(4) < c.replica_wait_for(8)
    one = predict(costs, Layout(1, 1, [2], 1, 1), c, 16, 4).step_s
    assert one == predict(costs, Layout(1, 1, [2], 1, 1), cpu(1.0), 16, 4).step_s  # one replica waits for none
    free = predict(costs, Layout(2, 1, [2], 1, 1), cpu(1.0, per_node=8), 16, 8).step_s
    waited = predict(costs, Layout(2, 1, [2], 1, 1), c, 16, 8).step_s
    assert waited == pytest.approx(1.2 * free, rel=1e-3)  # less the loss share's latency, which does not wait


def test_replica_wait_below_one_is_refused():
    with pytest.raises(ValueError, match="replica_wait must be at least 1.0"):
        Cluster(1, 2, "cpu", 1e9, FREE, FREE, FREE, replica_wait=0.9)
