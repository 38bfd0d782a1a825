"""The C++ extension's include graph (csrc/): each folder (cpu/, cuda/,
pipeline/) taken as one node and each file with its header as one, the
includes form a DAG, so no file includes something that includes it back
through a folder; and the layer ops' shared code reaches a backend only
through the LayerMath it is given, never backend.h."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def _node(path: Path) -> str:
    rel = path.relative_to(CSRC)
    return rel.parts[0] + "/" if len(rel.parts) > 1 else rel.with_suffix("").as_posix()


def _edges():
    edges = {}
    for path in [*CSRC.rglob("*.h"), *CSRC.rglob("*.cpp")]:
        for name in INCLUDE.findall(path.read_text()):
            target = (path.parent / name).resolve()
            if target.is_file() and CSRC in target.parents:
                src, dst = _node(path), _node(target)
                if src != dst:
                    edges.setdefault(src, set()).add(dst)
    return edges


def _cycle(edges):
    """A cycle of the graph as a list of nodes, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_include_graph_of_files_and_folders_has_no_cycle():
    edges = _edges()
    assert "cpu/" in edges and "layer_ops" in edges  # the graph was read
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"cpu/"}, "cpu/": {"a"}}) == ["a", "b", "cpu/", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_the_shared_layer_code_includes_no_backend():
    shared = ["layer_ops.h", "layer_step_loop.h", "layer_workspace.h", "layer_weight_grads.h",
              "layer_weight_grads.cpp", "cell_ops.h", "layer_checks.h", "layer_checks.cpp", "layer_gemm.cpp"]
    for name in shared:
        includes = INCLUDE.findall((CSRC / name).read_text())
        assert "backend.h" not in includes, name
        assert not any(i.startswith(("cpu/", "cuda/")) for i in includes), (name, includes)
