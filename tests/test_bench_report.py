"""Benchmark results a user can trust: the JSON result files, the tables and
headline summaries of the docs generated from them, and the grid bench that
fills them.

* the JSON writer records the command, rows, machine (CPU, ISA, cores,
  threads), versions, commit and date;
* the doc generator puts a JSON file's numbers between its markers, leaves
  the prose alone, and ``--check`` catches a stale or hand-edited table;
* a summary (README's headline) is computed from its JSON files, links the
  page with the full table, and ``--check`` catches it stale or edited too;
* ``python -m pipelstm.bench grid --quick --json ...`` times both sides of
  every row; the default grid covers every value of every axis.
"""

import argparse
import datetime
import glob
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import pipelstm
from pipelstm.bench import docs, grid, report, timing
from pipelstm.bench.table import Column, markdown
from pipelstm.bench.timing import interleaved_times, median_index

COLUMNS = [Column("name", "name"), Column("ours", "pipelstm ms", "{:.2f}", 1e3), Column("ratio", "ratio", "{:.2f}x")]
ROWS = [dict(name="small", ours=0.0012345, ratio=1.25), dict(name="large", ours=0.5, ratio=None)]


def _write(path, rows=ROWS, **kw):
    meta = report.metadata("demo", ["--quick", "--json", str(path)])
    return report.write_json(str(path), meta, COLUMNS, rows, **kw)


# --- the JSON file -------------------------------------------------------------------------------------------


def test_json_has_every_field(tmp_path):
    path = tmp_path / "sub" / "demo.json"  # the folder is created
    _write(path, notes=["a note"], extra=dict(x=float("nan")))
    data = json.loads(path.read_text())
    assert data["bench"] == "demo"
    assert data["command"] == f"python -m pipelstm.bench demo --quick --json {path}"
    assert data["rows"] == ROWS
    assert [c["key"] for c in data["columns"]] == ["name", "ours", "ratio"]
    m = data["machine"]
    assert m["cpu"] and m["cores"] == os.cpu_count() and m["threads"] >= 1
    assert m["isa"]["aten"] == torch.backends.cpu.get_cpu_capability()
    assert "pipelstm" in m["isa"] and isinstance(m["isa"]["env"], dict)
    assert data["versions"] == dict(torch=torch.__version__,
                                    python=".".join(map(str, sys.version_info[:3])), pipelstm=pipelstm.__version__)
    assert data["commit"] is None or len(data["commit"].split("-")[0]) == 40
    date = datetime.datetime.fromisoformat(data["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert data["notes"] == ["a note"] and data["extra"] == dict(x=None)  # NaN is not JSON: null
    assert report.read_json(str(path))["rows"] == ROWS


def test_isa_reports_env_and_pipelstm_isa(monkeypatch):
    for k in report.ISA_ENV + report.MEMORY_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(pipelstm._C, "cpu_isa", lambda: "avx2", raising=False)
    monkeypatch.setattr(pipelstm._C, "cpu_gemm", lambda: "aten", raising=False)
    info = report.isa()
    assert info["env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"} and info["pipelstm"] == "avx2"
    assert info["gemm"] == "aten"
    assert report.isa_label(info) == f"ATen {info['aten']}, pipelstm avx2 (GEMMs: aten) (ONEDNN_MAX_CPU_ISA=AVX2)"
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", "own")  # recorded with the ISA caps
    assert report.isa()["env"]["PIPELSTM_CPU_GEMM"] == "own"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")  # changes what the memory columns show
    assert report.isa()["env"]["MALLOC_ARENA_MAX"] == "1"
    monkeypatch.setenv("PIPELSTM_BUFFER_CACHE_MB", "0")  # and so does the cache of kept mappings
    assert report.isa()["env"]["PIPELSTM_BUFFER_CACHE_MB"] == "0"
    monkeypatch.delattr(pipelstm._C, "cpu_isa", raising=False)
    monkeypatch.delattr(pipelstm._C, "cpu_gemm", raising=False)
    assert report.isa()["pipelstm"] is None and report.isa()["gemm"] is None  # a build without them


def test_git_commit_and_dirty(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELSTM_SOURCE_COMMIT", raising=False)
    assert report.git_commit(str(tmp_path)) is None  # not a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / "__init__.py").write_text("")
    subprocess.run(git + ["add", "__init__.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    sha = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert report.git_commit(str(tmp_path)) == sha
    (tmp_path / "__init__.py").write_text("changed")
    assert report.git_commit(str(tmp_path)) == sha + "-dirty"
    monkeypatch.setenv("PIPELSTM_SOURCE_COMMIT", "abc123")  # a copy names the commit it came from
    assert report.git_commit(str(tmp_path)) == "abc123"


def test_repeats_below_five_only_with_quick():
    with pytest.raises(SystemExit):
        grid.main(["--repeats", "3", "--H", "16", "--B", "1", "--T", "2"])


def test_parse_arguments_adds_json_and_checks_the_bench_own_repeats_flag(capsys):
    def parser(quick):
        p = argparse.ArgumentParser(prog="demo")
        p.add_argument("--reps", type=int, default=5)
        if quick:
            p.add_argument("--quick", action="store_true")
        return p

    args = report.parse_arguments(parser(True), ["--reps", "2", "--quick", "--json", "out.json"], "--reps")
    assert (args.reps, args.quick, args.json) == (2, True, "out.json")
    assert report.parse_arguments(parser(False), [], "--reps").json is None
    for quick in (True, False):  # no --quick given, or none to give: 2 is too few
        with pytest.raises(SystemExit):
            report.parse_arguments(parser(quick), ["--reps", "2"], "--reps")
        assert "--reps must be at least 5" in capsys.readouterr().err


def test_the_shared_parser_has_threads_and_repeats_only_where_asked_for():
    p = report.argument_parser("demo", "what it does", threads=(1, 2), repeats=7, per="side")
    args = report.parse_arguments(p, ["--threads", "4"])
    assert (p.prog, args.threads, args.repeats, args.json) == ("python -m pipelstm.bench demo", [4], 7, None)
    assert "timed runs per side" in p.format_help()
    bare = report.argument_parser("demo", None)
    assert not hasattr(bare.parse_args([]), "threads") and not hasattr(bare.parse_args([]), "repeats")


def test_write_json_without_a_path_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert report.write_json(None, {}, [Column("a", "a")], [dict(a=1)]) is None
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""


def test_print_tables_shows_each_table_after_a_blank_line(capsys):
    second = [dict(name="x", ours=0.001, ratio=2.0)]
    report.print_tables([dict(title="one", columns=COLUMNS, rows=ROWS), dict(title="two", columns=COLUMNS,
                                                                             rows=second)])
    assert capsys.readouterr().out == f"\n{markdown(COLUMNS, ROWS)}\n\n{markdown(COLUMNS, second)}\n"


# --- tables and timing ---------------------------------------------------------------------------------------


def test_table_cells():
    text = markdown(COLUMNS + [Column("busy", "busy", "{:.1f}")], [dict(name="a", ours=0.002, ratio=None,
                                                                        busy=[1.25, 2.0])])
    assert text.splitlines() == ["| name | pipelstm ms | ratio | busy |", "|---|---|---|---|",
                                 "| a | 2.00 | - | 1.2 / 2.0 |"]


def test_interleaved_times_alternate_and_take_own_times():
    order = []
    times = interleaved_times({"a": lambda: order.append("a"), "b": lambda: order.append("b") or 7.0}, 3, warmup=1)
    assert order == ["a", "b"] * 4
    assert times["b"] == [7.0] * 3 and len(times["a"]) == 3
    assert median_index([3.0, 1.0, 2.0]) == 2 and median_index([4.0, 1.0, 3.0, 2.0]) == 3



def test_short_calls_are_timed_in_runs_of_many(monkeypatch):
    """With min_run_seconds, a run of a 1 ms call is 20 calls (from a warm
    call's time) and reports the time of one; a function that returns its
    own seconds still runs once a run."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    calls = {"short": 0, "own": 0}

    def short():
        calls["short"] += 1
        clock[0] += 0.001

    def own():
        calls["own"] += 1
        clock[0] += 0.001
        return 0.5

    times = interleaved_times({"short": short, "own": own}, 5, warmup=1, min_run_seconds=0.02)
    assert times["short"] == pytest.approx([0.001] * 5) and times["own"] == [0.5] * 5
    # 1 warm-up call, 1 to time, 19 more warm-up calls, then 5 runs of 20
    assert calls == {"short": 1 + 1 + 19 + 5 * 20, "own": 1 + 1 + 5}

# --- the doc generator ---------------------------------------------------------------------------------------

DOC = """# Benchmarks

Prose before, kept as it is.

<!-- bench:demo:begin -->
stale text typed by hand
<!-- bench:demo:end -->

Prose between.

<!-- bench:later:begin -->
<!-- bench:later:end -->

Prose after.
"""


def _docs(tmp_path, *extra):
    return docs.main(["--dir", str(tmp_path / "bench"), "--doc", str(tmp_path / "benchmarks.md"), *extra])


def test_docs_round_trip(tmp_path):
    _write(tmp_path / "bench" / "demo.json", notes=["The note."],
           tables=[dict(title="Summary", columns=[Column("geomean", "geomean", "{:.3f}x")], rows=[dict(geomean=1.5)])])
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC)
    assert _docs(tmp_path, "--check") == 1  # the hand-typed text is not what the JSON gives
    assert doc.read_text() == DOC  # --check writes nothing
    assert _docs(tmp_path) == 0
    text = doc.read_text()
    data = report.read_json(str(tmp_path / "bench" / "demo.json"))
    section = text.split("<!-- bench:demo:begin -->")[1].split("<!-- bench:demo:end -->")[0]
    for expected in ("| small | 1.23 | 1.25x |", "| large | 500.00 | - |", "**Summary**", "| 1.500x |", "The note.",
                     f"`{data['command']}`", data["machine"]["cpu"], f"{data['machine']['cores']} cores",
                     f"ATen {data['machine']['isa']['aten']}", data["versions"]["torch"], data["date"],
                     "from bench/demo.json"):
        assert expected in section, expected
    assert "stale text" not in text
    assert "_No results yet: bench/later.json is missing" in text
    for prose in ("Prose before, kept as it is.\n", "\nProse between.\n", "\nProse after.\n"):
        assert prose in text
    assert _docs(tmp_path, "--check") == 0  # up to date
    assert _docs(tmp_path) == 0 and doc.read_text() == text  # and stable


def test_docs_check_finds_stale_and_edited_tables(tmp_path, capsys):
    path = tmp_path / "bench" / "demo.json"
    _write(path)
    (tmp_path / "benchmarks.md").write_text(DOC)
    assert _docs(tmp_path) == 0
    data = json.loads(path.read_text())
    data["rows"][0]["ratio"] = 0.5  # a new measurement
    path.write_text(json.dumps(data))
    assert _docs(tmp_path, "--check") == 1
    assert "section 'demo' is not what" in capsys.readouterr().err
    assert _docs(tmp_path) == 0 and "| small | 1.23 | 0.50x |" in (tmp_path / "benchmarks.md").read_text()
    doc = tmp_path / "benchmarks.md"
    doc.write_text(doc.read_text().replace("0.50x", "1.50x"))  # a figure typed over
    assert _docs(tmp_path, "--check") == 1


def test_docs_json_without_markers_is_an_error(tmp_path, capsys):
    _write(tmp_path / "bench" / "orphan.json")
    (tmp_path / "benchmarks.md").write_text(DOC)
    assert _docs(tmp_path, "--check") == 1
    assert "bench/orphan.json has no <!-- bench:orphan:begin -->" in capsys.readouterr().err


def _grid_json(path, ratios):
    """A grid result file whose summary comes from grid.summarize over rows of these ratios."""
    rows = [dict(threads=1, mode="fwd", variant="dense", layers=1, H=64, B=1, T=32 * (i + 1), ratio=r,
                 ratio_padded=None) for i, r in enumerate(ratios)]
    summary = grid.summarize(rows)
    columns = [Column(k, k) for k in ("threads", "mode", "rows", "geomean", "worst", "at_least_1")]
    table = [Column("T", "T"), Column("ratio", "nn/ours", "{:.2f}x")]
    return report.write_json(str(path), report.metadata("grid", ["--json", str(path)]), table, rows,
                             tables=[dict(title="Per threads and mode", columns=columns, rows=summary)])


README = """# demo

<!-- bench-summary:g:begin -->
<!-- bench-summary:g:end -->
"""
PAGE = """# The grid

<!-- bench:g:begin -->
<!-- bench:g:end -->
"""


def _site(tmp_path, *extra):
    """README.md with a summary of bench/g.json, docs/page.md with its full table."""
    return docs.main(["--dir", str(tmp_path / "bench"), "--doc", str(tmp_path / "README.md"),
                      "--doc", str(tmp_path / "docs" / "page.md"), *extra])


def _summary(text):
    return text.split("<!-- bench-summary:g:begin -->")[1].split("<!-- bench-summary:g:end -->")[0]


def test_summary_is_generated_from_its_json_and_links_the_full_table(tmp_path):
    path = _grid_json(tmp_path / "bench" / "g.json", [2.0, 4.0])
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "docs" / "page.md").write_text(PAGE)
    assert _site(tmp_path, "--check") == 1  # empty sections: not what the JSON gives
    assert _site(tmp_path) == 0
    summary = _summary((tmp_path / "README.md").read_text())
    data = report.read_json(path)
    assert "geometric mean 2.83×" in summary and "2 of 2 rows ≥ 1.0× (lowest 2.00×)" in summary
    assert "[table](docs/page.md)" in summary  # the page holding bench:g, relative to the README
    assert data["date"][:10] in summary and "1 thread" in summary and "fp32" in summary
    assert "commit" not in summary  # the headline names the date, not the commit
    assert "from bench/g.json" in summary
    assert "| 32 | 2.00x |\n| 64 | 4.00x |" in (tmp_path / "docs" / "page.md").read_text()  # the full table
    assert _site(tmp_path, "--check") == 0


def test_summary_follows_its_json_and_catches_a_hand_edit(tmp_path, capsys):
    path = tmp_path / "bench" / "g.json"
    _grid_json(path, [2.0, 4.0])
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "docs" / "page.md").write_text(PAGE)
    assert _site(tmp_path) == 0
    _grid_json(path, [1.0, 0.25])  # a new measurement
    assert _site(tmp_path, "--check") == 1
    assert "section 'bench-summary:g' is not what" in capsys.readouterr().err
    assert _site(tmp_path) == 0
    summary = _summary((tmp_path / "README.md").read_text())
    assert "geometric mean 0.50×" in summary and "1 of 2 rows ≥ 1.0× (lowest 0.25×)" in summary
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("0.50×", "1.50×"))  # a figure typed over
    assert _site(tmp_path, "--check") == 1


def test_summary_of_a_missing_file_and_a_table_in_two_docs_are_errors(tmp_path, capsys):
    _grid_json(tmp_path / "bench" / "g.json", [2.0])
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(README.replace("bench-summary:g:", "bench-summary:g,nope:"))
    (tmp_path / "docs" / "page.md").write_text(PAGE)
    assert _site(tmp_path, "--check") == 1
    assert "bench/nope.json is missing" in capsys.readouterr().err
    (tmp_path / "README.md").write_text(README + PAGE)  # bench:g in both docs
    assert _site(tmp_path) == 1
    assert "<!-- bench:g:begin --> is also in" in capsys.readouterr().err


def test_every_bench_with_a_renderer_summarises_its_repository_json():
    """Each family's renderer reads the real files (a format change in a bench would break it here)."""
    from pipelstm.bench import summary

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = docs.load_results(os.path.join(root, "docs", "bench"))
    families = set()
    for name, data in results.items():
        if data["bench"] in summary.RENDERERS:
            rows = summary.summary_rows(data, "page.md")
            assert rows and all(r["result"] and r["setup"] and r["date"] == data["date"][:10] for r in rows), name
            families.add(data["bench"])
    assert {"grid", "gpu", "lm", "pipeline", "distributed"} <= families


def test_an_absolute_json_path_in_a_command_shows_where_the_file_lives():
    data = dict(command="python -m pipelstm.bench gpu --json /root/out/gpu.json --T 100", date="2026-01-01",
                machine=dict(cpu="c", cores=1, isa={}), versions={}, commit=None, columns=[], rows=[])
    text = docs.render(data, "bench/gpu.json", "/repo/docs/bench/gpu.json")
    assert "`python -m pipelstm.bench gpu --json docs/bench/gpu.json --T 100`" in text and "/root" not in text
    assert "--json /root/out/gpu.json" in docs.render(data, "bench/gpu.json")  # as recorded without json_path
    here = dict(data, command="python -m pipelstm.bench gpu --json /repo/docs/bench/gpu.json")
    assert "--json /repo/docs/bench/gpu.json`" in docs.render(here, "bench/gpu.json", "/repo/docs/bench/gpu.json")


def test_repository_docs_are_up_to_date():
    """README.md and docs/**/*.md match docs/bench/*.json (run `python -m pipelstm.bench docs` after a bench)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"),
                                                               recursive=True))
    if not os.path.exists(os.path.join(root, "docs", "bench")):
        pytest.skip("no docs/bench in this checkout")
    argv = ["--dir", os.path.join(root, "docs", "bench"), "--check"]
    for path in paths:
        argv += ["--doc", path]
    assert docs.main(argv) == 0


# --- the grid ------------------------------------------------------------------------------------------------


def test_default_grid_covers_every_axis_value():
    todo = grid.cases(grid.GRID["H"], grid.GRID["B"], grid.GRID["T"], [1, 4], grid.VARIANTS, grid.REPRESENTATIVE,
                      layers_given=False, sizes_given=False, full=False)
    assert {c.H for c in todo} == {64, 128, 256, 512, 1024}
    assert {c.B for c in todo} == {1, 8, 32, 64} and {c.T for c in todo} == {32, 128}
    assert {c.layers for c in todo} == {1, 4} and {c.variant for c in todo} == set(grid.VARIANTS)
    dense = [c for c in todo if (c.variant, c.layers) == ("dense", 1)]
    assert len(dense) == 5 * 4 * 2  # the whole H x B x T
    assert len(todo) == len(dense) + 4 * len(grid.REPRESENTATIVE)  # 4 layers, bidirectional, proj, packed
    picked = grid.cases([64], [8], [32], [1, 4], ["packed"], grid.REPRESENTATIVE, layers_given=True,
                        sizes_given=True, full=False)
    assert picked == [grid.Case("packed", 1, 64, 8, 32), grid.Case("packed", 4, 64, 8, 32)]


def test_grid_flops_match_the_layer_bench():
    from pipelstm.bench import layer

    T, B, H = 16, 4, 32
    for L in (1, 4):
        assert grid.flops(grid.Case("dense", L, H, B, T), T * B, "fwdbwd") == layer.flops(T, B, H, H, L)
        assert grid.flops(grid.Case("dense", L, H, B, T), T * B, "fwd") == layer.flops(T, B, H, H, L) / 3
    # bidirectional: twice the directions, the next layer's input 2H
    bi = grid.flops(grid.Case("bidirectional", 2, H, B, T), 1, "fwd")
    assert bi == 2 * (8 * H * (H + H)) + 2 * (8 * H * (2 * H + H))
    P = H // 2  # proj_size: recurrent input P, plus the projection
    assert grid.flops(grid.Case("proj", 1, H, B, T), 1, "fwd") == 8 * H * (H + P) + 2 * H * P


def test_summary_geomean_and_worst():
    rows = [dict(threads=1, mode="fwd", variant="dense", layers=1, H=64, B=1, T=32, ratio=2.0, ratio_padded=None),
            dict(threads=1, mode="fwd", variant="packed", layers=1, H=64, B=8, T=32, ratio=4.0, ratio_padded=0.5)]
    (s,) = grid.summarize(rows)
    assert s["rows"] == 2 and math.isclose(s["geomean"], 1.0) and s["worst"] == 0.5
    assert s["worst_row"] == "packed L=1 H=64 B=8 T=32" and s["at_least_1"] == 1


def test_grid_quick_writes_rows_with_both_sides_timed(tmp_path):
    path = tmp_path / "grid.json"
    cmd = [sys.executable, "-m", "pipelstm.bench", "grid", "--quick", "--repeats", "2", "--threads", "1",
           "--json", str(path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    data = report.read_json(str(path))
    assert data["bench"] == "grid" and data["command"].endswith(f"grid --quick --repeats 2 --threads 1 --json {path}")
    rows = data["rows"]
    assert {r["variant"] for r in rows} == set(grid.VARIANTS) and {r["mode"] for r in rows} == set(grid.MODES)
    for r in rows:
        assert r["ours"] > 0 and r["peer"] > 0 and math.isclose(r["ratio"], r["peer"] / r["ours"])
        assert len(r["samples"]["ours"]) == len(r["samples"]["peer"]) == 2
        assert r["isa"].startswith("ATen ")
        if r["variant"] == "packed":
            assert r["padded"] > 0 and math.isclose(r["ratio_padded"], r["padded"] / r["ours"])
        assert (r["of_mm"] is not None) == (r["H"] >= 512 and r["B"] >= 32)
    assert any(r["of_mm"] for r in rows)
    (summary,) = data["tables"][:1]
    assert [(s["threads"], s["mode"]) for s in summary["rows"]] == [(1, "fwd"), (1, "fwdbwd")]


def test_grid_budget_skips_and_reports(tmp_path):
    path = tmp_path / "grid.json"
    cmd = [sys.executable, "-m", "pipelstm.bench", "grid", "--quick", "--repeats", "1", "--threads", "1",
           "--variants", "dense", "--layers", "1", "--budget-seconds", "1e-9", "--json", str(path)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    data = report.read_json(str(path))
    assert data["rows"] == [] and len(data["skipped"]) == 2 * 2 * 2  # H x B x modes, all over budget
    assert "skipped 8 rows" in out and data["tables"][-1]["title"] == "Skipped (estimated too slow)"


def test_wavefront_quick_compares_threads_and_the_layer_wavefront(tmp_path):
    path = tmp_path / "wavefront.json"
    cmd = [sys.executable, "-m", "pipelstm.bench", "wavefront", "--quick", "--repeats", "2", "--chunks", "1", "4",
           "--json", str(path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    data = report.read_json(str(path))
    assert data["bench"] == "wavefront" and data["command"].endswith(f"--json {path}")
    rows = data["rows"]
    assert [r["pass"] for r in rows] == ["fwd+bwd", "forward"]
    for r in rows:
        assert set(r["samples"]) == {"peer", "threads", "wave1", "wave4"}
        assert all(len(v) == 2 for v in r["samples"].values())
        assert r["wave_ms"] == min(r["wave_by_k"].values()) and r["wave_by_k"][str(r["K"])] == r["wave_ms"]
        assert math.isclose(r["wave_vs_threads"], r["threads_ms"] / r["wave_ms"])
        assert math.isclose(r["threads_x"], r["peer"] / r["threads_ms"])
    assert "wavefront beat 2 intra-op threads in" in data["notes"][0]
