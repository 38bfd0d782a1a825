"""The CPU path of a float32 layer call (csrc/cpu/cpu_path.h,
cpu_identity.h): the CPU's identity as cpuid gives it (checked against
/proc/cpuinfo), and the choice by timing (pipelstm.backends.cpu.benchmark):
every candidate path computes the float64 results, the shape keeps the
fastest trial, the kept path is the one that runs afterwards (bit for bit
its trial's output), a cache file carries the choice to a fresh chooser, and
the switches restrict the candidates."""

import pytest
import torch

import pipelstm
from pipelstm import _C
from pipelstm.backends import cpu
from reference import layer, rel_error
from test_cpu_fused_loops import GRADS, _args, _float64, _reference_grads, _weights

forward = torch.ops.pipelstm.lstm_layer_forward
backward = torch.ops.pipelstm.lstm_layer_backward


def _cpuinfo() -> dict:
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                key, value = (part.strip() for part in line.split(":", 1))
                info.setdefault(key, value)
    return info


def test_identity_is_the_one_proc_cpuinfo_reports():
    info, me = _cpuinfo(), cpu.current_cpu()
    vendor = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(info["vendor_id"], info["vendor_id"])
    assert (me["vendor"], me["family"], me["model"]) == (vendor, int(info["cpu family"]), int(info["model"]))
    flags = info["flags"].split()
    if me["vendor"] == "AMD" and me["family"] == 0x19:
        assert me["microarchitecture"] == ("zen4" if "avx512f" in flags else "zen3")
        assert me["vector_datapath_bits"] == 256
    if me["vendor"] == "Intel":
        expected = ("intel-amx" if "amx_tile" in flags else "intel-avx512") if "avx512f" in flags else (
            "intel-avx2" if "avx2" in flags else "other")
        assert me["microarchitecture"] == expected
    assert me["vector_datapath_bits"] in (128, 256, 512)


def test_l2_size_is_the_one_sysfs_reports():
    """The L2 per core (the bound of the row split on some classes) is the
    size of cpu0's level-2 cache as the kernel lists it, where it does."""
    import glob
    import subprocess
    said = subprocess.run(["getconf", "LEVEL2_CACHE_SIZE"], capture_output=True, text=True).stdout.strip()
    if not said.isdigit() or int(said) <= 0:
        pytest.skip("the C library gives no L2 size here (l2_bytes is 0 and the Zen 5's bounds apply)")
    sizes = [open(d + "/size").read().strip() for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")
             if open(d + "/level").read().strip() == "2" and open(d + "/type").read().strip() != "Instruction"]
    if not sizes:
        pytest.skip("no L2 listed in sysfs")
    units = {"K": 1 << 10, "M": 1 << 20}
    expected = int(sizes[0][:-1]) * units[sizes[0][-1]] if sizes[0][-1] in units else int(sizes[0])
    assert cpu.current_cpu()["l2_bytes"] == expected


def _case(T=6, B=8, I=24, H=16, seed=3):
    torch.manual_seed(seed)
    w = _weights(I, H, 0, seed=seed)
    return w, torch.randn(T, B, I), torch.randn(B, H), torch.randn(B, H)


def _skip_without_candidates():
    if cpu.current_isa() == "generic":
        pytest.skip("the portable build is the only candidate: nothing is timed")


def _trial_outputs(chosen: dict, outputs: list) -> dict:
    """The output of each candidate's trial by path name: after the untimed
    first call, every candidate once in turn, then again those with a
    second trial (those whose first lost by far have none)."""
    order = list(chosen["seconds"])
    turns = order + [p for p in order if chosen["trials"][p] == 2]
    assert len(outputs) == 1 + len(turns)
    return dict(zip(turns, outputs[1:]))


def _until_chosen(w, x, h0, c0, candidates, want=None):
    """Forward calls of one shape until its path is chosen (at most the
    untimed first and two trials of each of `candidates`), each checked
    against the float64 output `want` where given; their outputs."""
    outputs = []
    while not cpu.chosen_paths():
        outputs.append(forward(x, h0, c0, *_args(w), False)[0])
        if want is not None:
            assert rel_error(outputs[-1].double(), want) < 1e-5
        assert len(outputs) <= 1 + 2 * candidates, "no choice after every candidate's trials"
    return outputs


def test_each_trial_computes_float64_results_and_the_fastest_is_kept(monkeypatch):
    _skip_without_candidates()
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    monkeypatch.delenv("PIPELSTM_CPU_BENCHMARK_CACHE", raising=False)
    _C._cpu_forget_chosen_paths()
    w, x, h0, c0 = _case()
    w64 = _float64(w)
    want = layer(x.double(), h0.double(), c0.double(), **w64)[0]
    outputs = _until_chosen(w, x, h0, c0, 4, want)
    (chosen,) = cpu.chosen_paths()
    assert chosen["shape"].startswith("forward T=6 B=8 rows=48 I=24 H=16 P=16 ")
    seconds, trials = chosen["seconds"], chosen["trials"]
    assert not any(p.endswith("/in-steps") for p in seconds)  # too little work a step to fit
    assert chosen["path"] == min(seconds, key=seconds.get) and trials[chosen["path"]] == 2
    # One trial only where the first lost by over 1.25x.
    assert all(n == 2 or (n == 1 and seconds[p] > 1.25 * min(seconds.values())) for p, n in trials.items())
    # The call of the kept path gives the bits of its trial.
    trial_of = _trial_outputs(chosen, outputs)
    again = forward(x, h0, c0, *_args(w), False)[0]
    assert torch.equal(again, trial_of[chosen["path"]])
    assert torch.equal(again, forward(x, h0, c0, *_args(w), False)[0])
    _C._cpu_forget_chosen_paths()


def test_the_forward_times_its_input_projection_in_the_steps_where_it_fits(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    monkeypatch.delenv("PIPELSTM_CPU_BENCHMARK_CACHE", raising=False)
    monkeypatch.delenv("PIPELSTM_INPUT_IN_STEPS", raising=False)
    _C._cpu_forget_chosen_paths()
    _skip_without_candidates()
    w, x, h0, c0 = _case(T=4, B=8, I=64, H=64, seed=11)  # 8 rows a step over 32 K weights: it fits
    want = layer(x.double(), h0.double(), c0.double(), **_float64(w))[0]
    outputs = _until_chosen(w, x, h0, c0, 6, want)
    (chosen,) = cpu.chosen_paths()
    order, isa = list(chosen["seconds"]), cpu.current_isa()
    # Both vector builds where AVX-512 runs on narrower FMA units (Zen 4), else the widest only.
    builds = 2 if isa == "avx512" and cpu.current_cpu()["vector_datapath_bits"] < 512 else 1
    assert f"{isa}/in-steps" in order and len(order) == 3 * builds
    trial_of = _trial_outputs(chosen, outputs)
    # Each trial ran as its path says: the in-steps one gives the bits of the
    # projection forced into the steps, the others those of the GEMM before them.
    _C._cpu_forget_chosen_paths()
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "0")
    monkeypatch.setenv("PIPELSTM_INPUT_IN_STEPS", "1")
    in_steps = forward(x, h0, c0, *_args(w), False)[0]
    monkeypatch.setenv("PIPELSTM_INPUT_IN_STEPS", "0")
    gemm_first = forward(x, h0, c0, *_args(w), False)[0]
    assert not torch.equal(in_steps, gemm_first), "both forms gave the same bits: nothing to tell them apart by"
    assert torch.equal(trial_of[f"{isa}/in-steps"], in_steps)
    assert torch.equal(trial_of[f"{isa}/{cpu.current_gemm()}"], gemm_first)
    # Forced either way, the form is no candidate; nor is it in a backward.
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    for _ in range(1 + 2 * 4):
        forward(x, h0, c0, *_args(w), False)
    assert not any(p.endswith("/in-steps") for p in cpu.chosen_paths()[0]["seconds"])
    _C._cpu_forget_chosen_paths()


# (I = H, rows a step) -> whether the AVX-512 build's default forward runs its
# input projection inside the steps, per GEMM: beside MKL's only small
# weights with 16 rows or more (measured on an Ice Lake), beside its own
# from 4 rows with weights up to 1 MiB.
DEFAULT_IN_STEPS = {
    "aten": {(64, 32): True, (96, 16): True, (64, 8): False, (128, 32): False},
    "own": {(64, 8): True, (128, 32): True, (64, 2): False},
}


def test_the_default_runs_the_input_projection_in_the_steps_where_it_was_measured_to_pay(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "0")
    avx512 = cpu.current_isa() == "avx512"  # the other builds keep the GEMM first everywhere
    for (H, B), in_steps in DEFAULT_IN_STEPS[cpu.current_gemm()].items():
        in_steps = in_steps and avx512
        w, x, h0, c0 = _case(T=5, B=B, I=H, H=H, seed=H + B)
        out = {}
        for switch in ("1", "0", "auto"):
            monkeypatch.setenv("PIPELSTM_INPUT_IN_STEPS", switch)
            out[switch] = forward(x, h0, c0, *_args(w), False)[0]
        if avx512:
            assert not torch.equal(out["1"], out["0"]), ("both forms gave the same bits", H, B)
        assert torch.equal(out["auto"], out["1" if in_steps else "0"]), (H, B, cpu.current_gemm(), in_steps)


def test_the_backward_is_chosen_apart_and_matches_float64(monkeypatch):
    _skip_without_candidates()
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    _C._cpu_forget_chosen_paths()
    w, x, h0, c0 = _case(T=5, B=4, I=12, H=8, seed=5)
    seeds = [torch.randn(5, 4, 8), torch.randn(4, 8), torch.randn(4, 8)]
    out, _, _, ws = forward(x, h0, c0, *_args(w), False)
    x64, h064, c064 = (v.double().requires_grad_() for v in (x, h0, c0))
    w64 = _float64(w)
    want = _reference_grads(lambda: layer(x64, h064, c064, **w64), [x64, h064, c064], w64, seeds)
    for _ in range(1 + 2 * 4):
        got = backward(*seeds, x, h0, c0, w["w_ih"], w["w_hh"], w["w_hr"], out, ws, False)
        for name, g, ref in zip(GRADS, got, want):
            assert g.numel() == 0 if ref is None else rel_error(g.double(), ref) < 1e-5, name
    passes = {p["shape"].split()[0] for p in cpu.chosen_paths()}
    assert "backward" in passes
    _C._cpu_forget_chosen_paths()


def test_a_cache_file_carries_the_choice_and_the_chosen_path_runs(monkeypatch, tmp_path):
    _skip_without_candidates()
    cache = tmp_path / "paths.tsv"
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK_CACHE", str(cache))
    _C._cpu_forget_chosen_paths()
    w, x, h0, c0 = _case(I=300, seed=7)  # I = 300: the input projection's GEMM rounds apart by path
    outputs = _until_chosen(w, x, h0, c0, 4)
    (chosen,) = cpu.chosen_paths()
    (line,) = cache.read_text().splitlines()
    me = cpu.current_cpu()["microarchitecture"]
    assert line.split("\t") == [me, chosen["shape"], chosen["path"]]
    # A path whose bits differ from the default path's (the untimed first call).
    order = list(chosen["seconds"])
    trial_of = _trial_outputs(chosen, outputs)
    other = [p for p, out in trial_of.items() if not torch.equal(out, outputs[0])]
    assert other, "every path gave the default path's bits: nothing to tell them apart by"
    # Another CPU class's line is passed over; this one's decides at once,
    # and its path runs.
    cache.write_text("\t".join(["some-other-cpu", chosen["shape"], order[0]]) + "\n" +
                     "\t".join([me, chosen["shape"], other[0]]) + "\n")
    _C._cpu_forget_chosen_paths()
    out = forward(x, h0, c0, *_args(w), False)[0]
    (read,) = cpu.chosen_paths()
    assert read["from_cache"] and read["path"] == other[0] and read["shape"] == chosen["shape"]
    assert torch.equal(out, trial_of[other[0]])
    _C._cpu_forget_chosen_paths()


def test_the_split_of_the_threads_is_a_candidate_where_both_are_possible(monkeypatch, tmp_path):
    """With 2 threads and 8 rows for each, the default path with the split
    its class's bounds do not pick (rows here: small weights, so panels) is
    timed too, computes the same bits, and runs its split when chosen; with
    one thread, or PIPELSTM_ROW_SPLIT set, it is no candidate."""
    _skip_without_candidates()
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    monkeypatch.delenv("PIPELSTM_CPU_BENCHMARK_CACHE", raising=False)
    monkeypatch.delenv("PIPELSTM_ROW_SPLIT", raising=False)
    monkeypatch.setenv("PIPELSTM_INPUT_IN_STEPS", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _C._cpu_forget_chosen_paths()
        w, x, h0, c0 = _case(T=4, B=16, I=32, H=32, seed=13)
        want = layer(x.double(), h0.double(), c0.double(), **_float64(w))[0]
        outputs = _until_chosen(w, x, h0, c0, 5, want)
        (chosen,) = cpu.chosen_paths()
        default = f"{cpu.current_isa()}/{cpu.current_gemm()}"
        assert f"{default}/panels" in chosen["seconds"] and f"{default}/rows" not in chosen["seconds"]
        trial_of = _trial_outputs(chosen, outputs)
        assert torch.equal(trial_of[f"{default}/panels"], trial_of[default])
        # Each path, named by a cache file, runs with its split.
        cache = tmp_path / "paths.tsv"
        monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK_CACHE", str(cache))
        me = cpu.current_cpu()["microarchitecture"]
        for path, blocks in ((f"{default}/panels", 1), (default, 2)):
            cache.write_text("\t".join([me, chosen["shape"], path]) + "\n")
            _C._cpu_forget_chosen_paths()
            forward(x, h0, c0, *_args(w), False)
            assert cpu.chosen_paths()[0]["path"] == path and _C._cpu_last_row_blocks() == blocks, path
        monkeypatch.delenv("PIPELSTM_CPU_BENCHMARK_CACHE")
        # Forced by the switch, or with one thread, the split is no candidate.
        for row_split, n in (("1", 2), (None, 1)):
            if row_split:
                monkeypatch.setenv("PIPELSTM_ROW_SPLIT", row_split)
            else:
                monkeypatch.delenv("PIPELSTM_ROW_SPLIT")
            torch.set_num_threads(n)
            _C._cpu_forget_chosen_paths()
            for _ in range(1 + 2 * 5):
                forward(x, h0, c0, *_args(w), False)
            for c in cpu.chosen_paths():  # none where a single candidate is left
                assert not any(p.endswith(("/rows", "/panels")) for p in c["seconds"]), (row_split, n)
    finally:
        torch.set_num_threads(threads)
        _C._cpu_forget_chosen_paths()


def test_switches_restrict_the_candidates_and_off_times_nothing(monkeypatch):
    _C._cpu_forget_chosen_paths()
    monkeypatch.delenv("PIPELSTM_CPU_BENCHMARK_CACHE", raising=False)
    w, x, h0, c0 = _case(seed=9)
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "0")
    for _ in range(12):
        forward(x, h0, c0, *_args(w), False)
    assert cpu.chosen_paths() == []
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "1")
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", "aten")
    _skip_without_candidates()
    # Weights that fit the steps: the projection in the steps is a candidate
    # too, so there are two at least even where one vector build is tried.
    w, x, h0, c0 = _case(T=4, B=8, I=64, H=64, seed=9)
    for _ in range(1 + 2 * 6):
        forward(x, h0, c0, *_args(w), False)
    (chosen,) = cpu.chosen_paths()
    named = [p for p in chosen["seconds"] if not p.endswith("/in-steps")]
    assert named and all(p.endswith("/aten") for p in named)
    _C._cpu_forget_chosen_paths()


def test_the_switches_read_and_refuse_as_the_others(monkeypatch):
    with cpu.flags(benchmark=True, benchmark_cache="x.tsv"):
        assert cpu.benchmark is True and cpu.benchmark_cache == "x.tsv"
    assert cpu.benchmark is False and cpu.benchmark_cache == ""
    for bad in ("yes", 1):
        try:
            cpu.benchmark = bad
        except TypeError as e:
            assert "pipelstm.backends.cpu.benchmark" in str(e) and "True or False" in str(e)
        else:
            raise AssertionError(f"benchmark = {bad!r} was taken")
    monkeypatch.setenv("PIPELSTM_CPU_BENCHMARK", "maybe")
    try:
        cpu.benchmark
    except RuntimeError as e:
        assert "PIPELSTM_CPU_BENCHMARK=maybe is not one of 0" in str(e)
    else:
        raise AssertionError("a bad PIPELSTM_CPU_BENCHMARK was read")
    assert pipelstm.LSTM  # the module imported for the ops
