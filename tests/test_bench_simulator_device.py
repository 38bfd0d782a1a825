"""pipelstm/bench/simulator_device.py: the simulator against pipeline stages
on one device. Its measurements need a GPU (``bench simulator --device
cuda``); here the same run on the CPU checks that every configuration is
calibrated, measured and predicted, and a missing GPU is refused."""

import pytest

from pipelstm.bench import simulator, simulator_device
from pipelstm.bench.pipelining_peer import SIZES


def test_every_configuration_is_measured_and_predicted():
    rows = [dict(dp=1, K=K, M=M) for _, K, M in simulator_device.CONFIGS]
    out = simulator_device.run("cpu", 1, simulator._item_sizes(SIZES[True], rows))
    assert [(r["pp"], r["K"], r["M"]) for r in out["rows"]] == simulator_device.CONFIGS
    for r in out["rows"]:
        assert r["seconds"] > 0 and r["predicted"] > 0
        assert r["error"] == pytest.approx(r["predicted"] / r["seconds"] - 1)
        assert sum(r["balance"]) == len(out["costs"].units())  # every unit, the loss in the last stage
        assert "rise" not in r  # memory: CUDA's allocator only
    assert out["rows"][0]["bubble"] == pytest.approx(0, abs=1e-9) and out["rows"][2]["bubble"] > 0.1


def test_cuda_without_a_gpu_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(simulator.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        simulator.main(["--device", "cuda"])
    assert "--device cuda: expected cpu, or cuda on a machine with a GPU" in capsys.readouterr().err
