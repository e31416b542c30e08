"""Common-subexpression elimination: nodes computing the same op on the same inputs merge.

Needs: a pure graph (every XG op is; `randn` is counter-based, so equal seeds give equal values).
EXTERN nodes (PyTorch operators, `fallback="eager"`) are never merged: the operator may be random.
Leaves: no two nodes with the same key; the first occurrence is kept, keeping source positions.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Op, Program, tree_map


def cse(program: Program) -> Program:
    g = program.main
    seen: dict[str, int] = {}
    alias: dict[int, int] = {}
    nodes = []
    for n in g.nodes:
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        if n.op in (Op.INPUT, Op.EXTERN):
            nodes.append(n)
            continue
        key = n.key()
        if key in seen:
            alias[n.id] = seen[key]
            continue
        seen[key] = n.id
        nodes.append(n)
    return program.replace_main(g.with_nodes(nodes, tree_map(g.output, lambda i: alias.get(i, i))))
