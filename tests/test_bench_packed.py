"""python -m pipelstm.bench packed: runs end to end at a tiny size and writes
its JSON (the corpus named, both sides, the speedup from their medians)."""

import json

from pipelstm.bench import packed


def test_bench_packed_writes_both_sides(tmp_path):
    path = tmp_path / "packed.json"
    rows = packed.main(["--quick", "--reps", "1", "--vocab", "40", "--emb", "8", "--hidden", "8", "--batch", "6",
                        "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["bench"] == "packed" and data["corpus"].startswith("pydoc topics")
    by_side = {r["side"]: r for r in data["rows"]}
    assert set(by_side) == {"packed", "padded"} and [r["side"] for r in rows] == ["packed", "padded"]
    assert by_side["packed"]["tokens"] < by_side["padded"]["tokens"]  # the padding is not computed
    assert abs(by_side["packed"]["speedup"] - by_side["padded"]["seconds"] / by_side["packed"]["seconds"]) < 1e-9
    assert data["padding_ratio"] > 1


def test_sentence_lengths_of_the_examples_corpus():
    lengths, name = packed.sentence_lengths(None)
    assert len(lengths) > 1000 and min(lengths) >= 2 and "pydoc" in name
