"""The import graph, beyond what import-linter's contracts (pyproject.toml) can say.

`lint-imports` checks the layers and that sibling packages and modules never import each other in
a cycle. A cycle through a package's own `__init__` (the package imports a module of its own that
imports the package back) is not between siblings, so no contract sees it: this test does.
"""

from __future__ import annotations

import grimp


def _components(graph: grimp.ImportGraph) -> list[set[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:      # iterative: the graph is deeper than Python's recursion limit allows
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_package_imports_back_from_its_own_modules() -> None:
    graph = grimp.build_graph("xgbuild", "xg")
    through_init = [sorted(c) for c in _components(graph)
                    if any(other.startswith(m + ".") for m in c for other in c)]
    assert not through_init, through_init


def test_the_check_sees_such_a_cycle(tmp_path, monkeypatch) -> None:
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("from .inner import f\n")
    (package / "inner.py").write_text("def f():\n    from . import g\n    return g\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    components = _components(grimp.build_graph("cyclic"))
    assert [sorted(c) for c in components] == [["cyclic", "cyclic.inner"]]
