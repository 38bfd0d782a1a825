"""pipelstm/bench/gpu.py: the GPU grid bench, checked on the CPU
(``--device cpu --quick``): every setting of every size is timed on both
sides and written as JSON with its device and switches; a dtype nn.LSTM
refuses, a row over its time limit and a missing GPU are each reported,
not fatal or silent."""

import json

import pytest
import torch
from torch import nn

from pipelstm.bench import docs, gpu


def _run(tmp_path, *extra):
    path = tmp_path / "gpu.json"
    gpu.main(["--device", "cpu", "--quick", "--repeats", "2", "--json", str(path), *extra])
    return json.loads(path.read_text())


def test_every_setting_and_size_is_timed_on_both_sides(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    data = _run(tmp_path)
    grid = gpu.QUICK_GRID
    assert len(data["rows"]) == len(gpu.SETTINGS) * len(grid["layers"]) * len(grid["T"]) * len(grid["B"]) * len(
        grid["H"])
    for row in data["rows"]:
        assert row["ours"] > 0 and row["peer"] > 0 and row["note"] is None
        assert row["ratio"] == pytest.approx(row["peer"] / row["ours"])
        assert row["of_floor"] == pytest.approx(row["ours"] / row["floor"])
        assert len(row["samples"]["ours"]) == len(row["samples"]["peer"]) == 2
        assert row["ours_host"] > 0 and row["peer_host"] > 0
        assert row["host_of_step"] == pytest.approx(row["ours_host"] / row["ours"])
    summary = data["tables"][0]["rows"]
    assert [s["setting"] for s in summary] == list(gpu.SETTINGS)
    assert all(s["stack"] > 0 and s["skipped"] == 0 for s in summary)  # 4 layers over 1 at B <= 32
    assert all(s["host"] > 0 for s in summary)
    assert data["device"]["name"].startswith("CPU")
    assert data["switches"] == {"PIPELSTM_CUDA_GRAPHS": "1"}
    # The docs' command shows the switches it ran with.
    assert "`PIPELSTM_CUDA_GRAPHS=1 python -m pipelstm.bench gpu" in docs.render(data, "bench/gpu.json")


def test_host_time_stops_before_the_device_is_waited_for():
    import time
    sides = {"ours": lambda: time.sleep(0.01), "peer": lambda: time.sleep(0.02)}
    host = gpu._host_times(sides, 3, sync=lambda: time.sleep(0.5))  # a slow GPU's synchronize
    assert 0.01 <= host["ours_host"] < 0.4 and 0.02 <= host["peer_host"] < 0.4


def test_the_settings_set_tf32_and_put_it_back():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    with gpu.Settings("fp32"):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    with gpu.Settings("default"):
        assert torch.backends.cudnn.allow_tf32  # torch's own default, left alone
    assert torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_a_dtype_nn_lstm_refuses_is_a_note_and_ours_is_still_timed(tmp_path, monkeypatch):
    forward = nn.LSTM.forward

    def refusing(self, x, hx=None):
        if x.dtype == torch.bfloat16:
            raise RuntimeError("no bf16 RNN in this cuDNN\nsecond line")
        return forward(self, x, hx)

    monkeypatch.setattr(nn.LSTM, "forward", refusing)
    rows = _run(tmp_path, "--settings", "bf16", "fp32")["rows"]
    for row in rows:
        if row["setting"] == "bf16":
            assert row["note"] == "nn.LSTM: no bf16 RNN in this cuDNN"
            assert row["ours"] > 0 and row["peer"] is None and row["ratio"] is None
        else:
            assert row["note"] is None and row["ratio"] > 0


def test_a_row_over_its_time_limit_is_skipped_and_counted(tmp_path):
    data = _run(tmp_path, "--row-seconds", "0", "--settings", "fp32")
    assert all(r["ours"] is None and r["note"].startswith("skipped: one ours run took") for r in data["rows"])
    assert data["tables"][0]["rows"][0]["skipped"] == len(data["rows"])


def test_rows_past_the_budget_are_listed_as_not_run(tmp_path):
    data = _run(tmp_path, "--budget-seconds", "0", "--settings", "fp32", "bf16")
    first, *rest = data["rows"]
    assert first["ours"] > 0  # the clock starts with the first row
    assert rest and all(r["ours"] is None and r["note"] == "not run: past --budget-seconds 0" for r in rest)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu_and_cpu_without_quick_are_refused(capsys):
    for argv in (["--quick"], ["--device", "cpu"]):
        with pytest.raises(SystemExit) as e:
            gpu.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--device cuda needs a GPU" in err and "add --quick" in err


def test_a_variant_is_timed_with_its_switches_set_and_only_for_its_calls(tmp_path, monkeypatch):
    seen = []
    step = gpu.training_step

    def recording(model, x):
        run = step(model, x)

        def wrapped():
            if isinstance(model, gpu.LSTM):
                seen.append(gpu.cuda_switches.layer_wavefront)
            run()
        return wrapped

    monkeypatch.setattr(gpu, "training_step", recording)
    data = _run(tmp_path, "--settings", "fp32", "--variant", "layer_wavefront=3")
    assert data["variant"] == {"layer_wavefront": 3}
    for row in data["rows"]:
        assert row["variant"] > 0 and row["variant_gain"] == pytest.approx(row["ours"] / row["variant"])
        assert len(row["samples"]["variant"]) == 2
    assert "variant_gain" in [c["key"] for c in data["columns"]]
    assert set(seen) == {0, 3}  # the switch set for the variant's calls, not for the plain side's
    assert gpu.cuda_switches.layer_wavefront == 0


def test_a_variant_that_is_not_a_switch_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        _run(tmp_path, "--variant", "wavefront=8")


def test_a_variant_run_is_summed_up_by_its_gain_not_by_cudnn(tmp_path):
    from pipelstm.bench import summary
    data = _run(tmp_path, "--settings", "fp32", "--variant", "layer_wavefront=3")
    [row] = summary.gpu(data)
    gains = [r["variant_gain"] for r in data["rows"]]
    assert row["what"].startswith("`pipelstm.LSTM` with `layer_wavefront=3` vs without")
    assert f"{sum(g >= 1.0 for g in gains)} of {len(gains)} rows" in row["result"]


def test_memory_adds_the_graphs_a_row_captured_to_their_side(monkeypatch):
    """Each side's allocator peak, plus the graph memory the row added: the
    layer ops' to pipelstm, the stacks' to the variant, none to cuDNN."""
    peaks = {"ours": 100, "peer": 400, "variant": 90}
    sides = {name: (lambda n=name: n) for name in peaks}
    monkeypatch.setattr(gpu, "device_peak_bytes", lambda run: peaks[run()])
    monkeypatch.setattr(gpu, "_graph_memory", lambda: dict(ours=70, variant=1030))
    got = gpu._memory(sides, dict(ours=50, variant=1000))
    assert got == dict(ours_memory=120, peer_memory=400, variant_memory=120, memory_ratio=0.3)
    # graphs dropped from the cache during the row count as none, not as less
    monkeypatch.setattr(gpu, "_graph_memory", lambda: dict(ours=10, variant=1000))
    assert gpu._memory(sides, dict(ours=50, variant=1000))["ours_memory"] == 100
