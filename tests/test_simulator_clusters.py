"""The described clusters (pipelstm.simulator.clusters): which link joins
two ranks, what a ring all-reduce over them costs, the local loopback."""

import pytest

from pipelstm.simulator import Link
from pipelstm.simulator.clusters import (IB_NDR, NVLINK4, PCIE5, PRESETS, describe, h100_cluster, h100_node,
                                         local_machine, measure_loopback, measure_machine, pcie_node)


def test_h100_node_links():
    node = h100_node()
    assert node.world_size == 8 and node.device_memory == 80e9
    assert node.link(0, 7) == NVLINK4
    assert node.link(3, 3).bytes_per_s > NVLINK4.bytes_per_s
    # 1 GB over NVLink: 10 µs + 1e9 / 360e9 s
    assert node.link(0, 1).seconds(1e9) == pytest.approx(10e-6 + 1e9 / 360e9)


def test_cluster_links_cross_nodes_over_infiniband():
    c = h100_cluster(4)
    assert c.world_size == 32
    assert c.link(6, 7) == NVLINK4 and c.link(7, 8) == IB_NDR and c.link(0, 31) == IB_NDR
    assert pcie_node().link(0, 1) == PCIE5


def test_allreduce_over_the_slowest_link_of_the_ring():
    c = h100_cluster(4)
    n = 1e9
    inside = c.allreduce_seconds(list(range(8)), n)  # one node: NVLink all the way
    assert inside == pytest.approx(2 * 7 * NVLINK4.seconds(n / 8))
    across = c.allreduce_seconds([0, 8, 16, 24], n)  # a stage's replicas on 4 nodes
    assert across == pytest.approx(2 * 3 * IB_NDR.seconds(n / 4))
    assert across > inside
    assert c.allreduce_seconds([5], n) == 0.0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="h100_node: gpus must be at most 8"):
        h100_node(9)
    with pytest.raises(ValueError, match="h100_node: gpus must be a positive int, got 0"):
        h100_node(0)
    with pytest.raises(ValueError, match="h100_cluster: nodes must be a positive int, got 2.5"):
        h100_cluster(2.5)
    with pytest.raises(ValueError, match="local_machine: processes must be a positive int"):
        local_machine(0, link=Link(1e-5, 1e9))
    with pytest.raises(ValueError, match="local_machine: memory must be positive bytes"):
        local_machine(2, link=Link(1e-5, 1e9), memory=-1)
    with pytest.raises(ValueError, match="measure_loopback: needs two or more sizes"):
        measure_loopback(sizes=[1024])


def test_local_machine_and_describe():
    link = Link(20e-6, 2e9)
    c = local_machine(2, link=link, memory=2 ** 30)
    assert c.link(0, 1) == link and c.link(0, 0).seconds(1e9) == 0.0
    d = describe(c)
    assert d["intra_node"] == dict(latency_us=pytest.approx(20.0), GB_per_s=pytest.approx(2.0))
    assert d["device_memory_GiB"] == pytest.approx(1.0)
    for name, (build, assumptions) in PRESETS.items():
        assert describe(build())["device"].startswith("H100") and "assumed" in assumptions


def test_measured_loopback_is_plausible():
    link = measure_loopback()
    # Loopback through the kernel: between 10 MB/s and 100 GB/s, under 10 ms a message.
    assert 1e7 < link.bytes_per_s < 1e11 and 0.0 <= link.latency_s < 1e-2


def test_a_measured_allreduce_replaces_the_ring_within_a_node():
    link, measured = Link(20e-6, 2e9), Link(200e-6, 1e9)
    c = local_machine(4, link=link, allreduce=measured, compute_sharing=1.4)
    assert c.compute_sharing == 1.4
    nbytes = 8e6
    assert c.allreduce_seconds([0, 1], nbytes) == pytest.approx(measured.seconds(nbytes))  # as measured for two
    assert c.allreduce_seconds([0, 1, 2, 3], nbytes) == pytest.approx(3 * 200e-6 + 1.5 * nbytes / 1e9)  # a ring's scaling
    ring = local_machine(2, link=link)
    assert ring.allreduce_seconds([0, 1], nbytes) == pytest.approx(2 * link.seconds(nbytes / 2))
    assert describe(c)["allreduce"] == dict(latency_us=pytest.approx(200.0), GB_per_s=pytest.approx(1.0))


def test_measured_machine_is_plausible():
    link, allreduce, sharing, wait, handling = measure_machine()
    assert 1e7 < link.bytes_per_s < 1e11 and 0.0 <= link.latency_s < 1e-2
    # gloo's all-reduce moves the bytes both ways and adds them: no faster than a send
    assert 1e7 < allreduce.bytes_per_s < 1e11 and 0.0 <= allreduce.latency_s < 1e-2
    assert 1.0 <= sharing < 4.0 and 1.0 <= wait < 4.0
    # DDP copies the gradients into its buckets and back: slower than 10 TB/s, under 10 ms of fixed cost
    assert handling.bytes_per_s <= 1e13 and 0.0 <= handling.latency_s < 1e-2
    assert local_machine(2, **measure_machine()._asdict()).replica_wait >= 1.0
