"""The user docs (README.md, docs/**/*.md) carry no issue numbers, commit
hashes or local paths: history goes in CHANGELOG.md.

Generated benchmark tables (between ``<!-- bench:NAME:begin/end -->``) may
name commits: their heading names the commit a measurement ran at, its
provenance. Everything else, the headline summaries included, is checked
for all three.
"""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED = re.compile(r"^<!-- bench:(?P<name>[\w.-]+):begin -->\n.*?^<!-- bench:(?P=name):end -->$",
                       re.MULTILINE | re.DOTALL)
COMMIT = ("a commit hash", re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"))
RULES = [
    ("an issue number", re.compile(r"\b(?:issue|issues|PR|pull request)s? #?\d+\b", re.IGNORECASE)),
    ("an issue number", re.compile(r"(?<![\w&/#])#\d+\b")),
    COMMIT,
    ("a local path", re.compile(r"(?<![\w.])(?:/work/|/root/|/home/\w|/Users/\w|/tmp/\w|\.\./shared\b|/mnt/\w)")),
]


def user_docs():
    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                  recursive=True))
    return [d for d in docs if os.path.exists(d)]


def problems(text):
    """(line number, what, the match) of every rule broken (a commit hash only
    outside the generated tables)."""
    generated = set()
    for m in GENERATED.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        generated.update(range(first, first + m.group(0).count("\n") + 1))
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, rule in RULES:
            if (what, rule) == COMMIT and number in generated:
                continue
            found += [(number, what, m.group(0)) for m in rule.finditer(line)]
    return found


def test_rules_catch_what_they_are_for():
    bad = ["the aims of issue 11", "see #14 for it", "fixed in 4688b26", "commit c6ad5be's message",
           "D=/work/shared/data/wikitext-2", "../shared/data", "a /tmp/trace.json", "Issues 3 and 4",
           "--json /root/out/gpu.json"]
    for line in bad:
        assert problems(line), line
    good = ["## Heading", "[x](#pipelstmops)", "H = 1024, B = 64", "sm_80", "`--timeout` + 12 s",
            "1.5e-2 (≤ 1e-4 up to batch 40)", "&#8212;", "docs/bench/gpu.json", "0.84–2.26×", "deadbeef",
            "fp16 1.30×; 21 of 30 rows", "python -m pipelstm.bench docs"]
    for line in good:
        assert not problems(line), (line, problems(line))


def test_generated_tables_may_name_commits_but_not_local_paths():
    table = "<!-- bench:x:begin -->\ncommit 4688b26abcde; `--json docs/bench/x.json`\n<!-- bench:x:end -->\n"
    assert not problems(table)
    assert [p[1] for p in problems(table.replace("docs/bench", "/root/out"))] == ["a local path"]
    summary = table.replace("bench:x:", "bench-summary:x:")
    assert [p[1] for p in problems(summary)] == ["a commit hash"]


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: os.path.relpath(p, ROOT))
def test_user_doc_has_no_issue_numbers_hashes_or_local_paths(path):
    with open(path) as f:
        found = problems(f.read())
    assert not found, "\n".join(f"{os.path.relpath(path, ROOT)}:{n}: {what}: {m!r}" for n, what, m in found)


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def broken_links(path):
    """The relative links of a doc whose file or folder does not exist."""
    text = open(path).read()
    here = os.path.dirname(path)
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")
            and not os.path.exists(os.path.normpath(os.path.join(here, t)))]


def test_the_link_check_finds_a_broken_link(tmp_path):
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("b")
    doc.write_text("[ok](b.md) [section](b.md#x) [web](https://pytorch.org) [gone](design/c.md)")
    assert broken_links(str(doc)) == ["design/c.md"]


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(path):
    assert not broken_links(path)
