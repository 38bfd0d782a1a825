"""The H100 cost model (pipelstm.simulator.gpu_costs): the LSTM fit
recovers a known law, its phases add up to what was measured, the other
units follow the spec sheet."""

import os

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.simulator.gpu_costs import H100_SXM, H200, GpuCosts, fit_lstm, gpu_costs, load_bench_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAW = dict(c0=3e-4, a=1.5e-5, g=5e-12, w=3e-14, p=5e-11)


def law_rows(setting="bf16"):
    rows = []
    for T in (100, 500):
        for B in (1, 8, 32, 128, 512):
            for H in (256, 512, 1024):
                y = LAW["c0"] + T * (LAW["a"] + LAW["g"] * H * H + LAW["w"] * B * H * H + LAW["p"] * B * H)
                rows.append(dict(setting=setting, layers=1, T=T, B=B, H=H, ours=y, device="GPU"))
    return rows


def test_fit_recovers_a_known_law():
    fit = fit_lstm(law_rows(), "bf16")
    for k, v in LAW.items():
        assert getattr(fit, k) == pytest.approx(v, rel=1e-6), k
    assert fit.max_rel_error < 1e-9 and fit.points == 30 and fit.H_range == [256, 1024]


def test_fit_refuses_too_few_rows_or_mixed_devices():
    with pytest.raises(ValueError, match="0 one-layer rows of setting 'fp16'; 5 or more needed"):
        fit_lstm(law_rows(), "fp16")
    rows = law_rows()
    rows[0] = dict(rows[0], device="other")
    with pytest.raises(ValueError, match="rows from several devices"):
        fit_lstm(rows, "bf16")


def test_the_repository_measurements_fit_within_ten_percent():
    paths = [os.path.join(ROOT, "docs", "bench", f) for f in ("gpu.json", "gpu_t500_16bit.json")]
    fit = fit_lstm(load_bench_rows(paths), "bf16")
    assert fit.measured_on == "NVIDIA H200" and fit.points == 30
    assert fit.max_rel_error < 0.10


def small_lm():
    with torch.device("meta"):
        return nn.Sequential(nn.Embedding(1000, 64), pipelstm.LSTM(64, 256, num_layers=2, dropout=0.1),
                             nn.Dropout(0.1), nn.Linear(256, 1000))


def test_lstm_phases_add_up_to_the_fit():
    fit = fit_lstm(law_rows(), "bf16")
    costs = gpu_costs(small_lm(), fit, "bf16", loss_vocab=1000, spec=H200)  # fitted on the device simulated
    kinds = [u.kind for u in costs.units()]
    assert kinds == ["embedding", "lstm", "dropout", "lstm", "dropout", "linear", "cross_entropy"]
    T, B = 64, 32
    lstm = 3  # the second layer: I = H = 256
    total = sum(costs.seconds(lstm, ph, T, B) for ph in ("forward", "backward", "weights"))
    # The weight gradients carry no per-call cost: the fit's c0 minus nothing, all in forward + backward.
    assert total == pytest.approx(fit.seconds(T, B, 256, 256), rel=1e-12)
    # On the H100 the memory-bound terms grow by the HBM ratio; the rest does not change.
    h100 = gpu_costs(small_lm(), fit, "bf16", loss_vocab=1000)
    t = fit.terms(T, B, 256, 256)
    slower = (t["weights_read"] + t["pointwise"]) * (H200.hbm_bytes_per_s / H100_SXM.hbm_bytes_per_s - 1)
    assert sum(h100.seconds(lstm, ph, T, B) for ph in ("forward", "backward", "weights")) == \
        pytest.approx(total + slower, rel=1e-12)


def test_spec_sheet_units():
    fit = fit_lstm(law_rows(), "bf16")
    costs = gpu_costs(small_lm(), fit, "bf16", loss_vocab=1000)
    n = 64 * 512
    flops = 2 * n * 256 * 1000  # the decoder's forward GEMM
    expect = H100_SXM.launch_s + max(flops / (989e12 * 0.6), (n * 256 + n * 1000 + 256 * 1000) * 2 / (3.35e12 * 0.8))
    assert costs.seconds(5, "forward", 64, 512) == pytest.approx(expect)
    assert costs.seconds(0, "backward", 64, 512) == 0.0  # an Embedding's input is indices
    assert costs.output_bytes(4, 8, 2) == 8 * 2 * 256 * 2  # a Dropout's width is what it gets
    assert costs.units()[1].param_bytes == 4 * 256 * (64 + 256 + 2) * 2
    assert costs.units()[1].state_bytes_per_row == 2 * 256 * 2


def test_bad_settings_are_named():
    fit = fit_lstm(law_rows(), "bf16")
    with pytest.raises(ValueError, match="setting must be one of"):
        gpu_costs(small_lm(), fit, "int8")
    with pytest.raises(ValueError, match="the LSTM fit is of setting 'bf16', not 'fp32'"):
        gpu_costs(small_lm(), fit, "fp32")
    costs = gpu_costs(small_lm(), fit, "bf16")
    with pytest.raises(ValueError, match="phase must be forward, backward or weights"):
        costs.seconds(1, "update", 4, 4)
