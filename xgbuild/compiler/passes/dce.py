"""Dead-code elimination: keep what the outputs need, and every engine input.

Needs: a graph in topological order. Leaves: only nodes an output depends on (plus INPUT nodes,
which are the engine's signature even when unused).
"""

from __future__ import annotations

from ..ir.graph import Op, Program, tree_ids


def dce(program: Program) -> Program:
    g = program.main
    live = set(tree_ids(g.output))
    for n in reversed(g.nodes):
        if n.id in live:
            live.update(n.inputs)
    nodes = [n for n in g.nodes if n.id in live or n.op is Op.INPUT]
    return program.replace_main(g.with_nodes(nodes))
