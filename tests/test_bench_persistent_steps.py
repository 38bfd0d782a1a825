"""bench persistent_steps: the persistent kernels' GPU check output as a
result file, read from an excerpt of that program's output on an H200."""

import json

import pytest

from pipelstm.bench import docs, persistent_steps

LOG = """\
device NVIDIA H200, 132 SMs, 232448 bytes shared memory per block (opt-in)
ok   forward fp16 T=3 B=1 H=1 unit_tiles=0 reverse=0 error 0.000000
time fp16 T=100 B=1 H=256: forward 0.492 ms (32 blocks, 8 slices), backward 0.542 ms (16 blocks, 8 slices)
time fp16 T=100 B=1 H=256, us a forward step: tensor-core 4.91, barrier(0) 3.06, barrier(4) 3.06, \
barrier(8) 3.21, barrier(16) 3.16, st.async(0) 2.77, st.async(4) 2.75, st.async(8) 3.08, st.async(16) 3.05; \
a backward step: tensor-core 5.37, cluster(0) 3.84, cluster(4) 3.85, cluster(8) 3.62, cluster(16) 3.93
time fp16 T=100 B=32 H=512, us a forward step: tensor-core 6.71, barrier(0) 9.42, barrier(4) nan, \
barrier(8) nan, barrier(16) 9.43, st.async(0) 9.22, st.async(4) nan, st.async(8) nan, st.async(16) 9.23; \
a backward step: tensor-core 16.82, cluster(0) nan, cluster(4) nan, cluster(8) nan, cluster(16) nan
PASS: 0 failed
"""


def _row(rows, B, kernel, blocks):
    return next(r for r in rows if (r["B"], r["kernel"], r["blocks"]) == (B, kernel, blocks))


def test_each_kernel_and_cluster_size_is_a_row():
    parsed = persistent_steps.parse(LOG.splitlines())
    rows = parsed["rows"]
    assert parsed["device"] == "NVIDIA H200"
    assert len(rows) == 2 * 9  # a shape: the grid kernel, two ways x (default, 4, 8, 16)
    grid = _row(rows, 1, "grid tensor-core", "grid")
    assert (grid["forward_us"], grid["backward_us"]) == (4.91, 5.37)
    barrier = _row(rows, 1, "cluster barrier", "default")
    assert (barrier["forward_us"], barrier["backward_us"]) == (3.06, 3.84)  # the backward's cluster is the barrier's
    assert _row(rows, 1, "cluster st.async", "4") == dict(dtype="fp16", T=100, B=1, H=256, kernel="cluster st.async",
                                                          blocks="4", forward_us=2.75, backward_us=None)
    refused = _row(rows, 32, "cluster barrier", "8")
    assert refused["forward_us"] is None and refused["backward_us"] is None  # does not fit: no time


def test_the_summary_names_the_fastest_kernel():
    summary = persistent_steps.summarize(persistent_steps.parse(LOG.splitlines())["rows"])
    small, large = summary
    assert (small["best_forward"], small["best"]) == (2.75, "cluster st.async (4)")
    assert (small["best_backward"], small["best_bwd"]) == (3.62, "cluster barrier (8)")
    assert (large["best_forward"], large["best"]) == (6.71, "grid tensor-core (grid)")
    assert large["best_backward"] == large["grid_backward"] == 16.82


def test_writes_a_result_file_the_docs_render(tmp_path):
    log, out = tmp_path / "check.log", tmp_path / "steps.json"
    log.write_text(LOG)
    persistent_steps.main(["--log", str(log), "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["bench"] == "persistent_steps" and data["device"]["name"] == "NVIDIA H200"
    assert len(data["rows"]) == 18 and data["tables"][0]["rows"][0]["best"] == "cluster st.async (4)"
    text = docs.render(data, "steps.json")
    assert "Device: NVIDIA H200" in text and "cluster st.async" in text


def test_a_log_without_timings_is_refused_by_name(tmp_path, capsys):
    log = tmp_path / "check.log"
    log.write_text("device NVIDIA H200, 132 SMs, 232448 bytes\nFAIL build\n")
    with pytest.raises(SystemExit):
        persistent_steps.main(["--log", str(log)])
    assert "--log: no 'time ... us a forward step' line" in capsys.readouterr().err
