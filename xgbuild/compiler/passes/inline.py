"""Inlining: every CALL is replaced by a copy of the callee's body.

Needs: functions listed callee-first (lowering's order), no recursion (the checker rejects it).
Leaves: a `main` with no CALL or PROJ nodes and no function graphs; callee dims are renamed to
the caller's (the call's `dims` attribute), so shapes stay exact.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, GraphBuilder, Op, Program, tree_ids, tree_map


def _subst(shape, dims: dict) -> tuple:
    return tuple(dims.get(d, d) if isinstance(d, str) else d for d in shape)


def _inline_graph(graph: Graph, done: dict[str, Graph]) -> Graph:
    b = GraphBuilder(graph.name)
    new: dict[int, int] = {}
    call_outputs: dict[int, list[int]] = {}
    for n in graph.nodes:
        if n.op is Op.CALL:
            callee = done[n.attr("func")]
            dims = dict(n.attr("dims", ()))
            args = [new[i] for i in n.inputs]
            local: dict[int, int] = {}
            for c in callee.nodes:
                if c.op is Op.PARAM:
                    local[c.id] = args[c.attr("index")]
                    continue
                local[c.id] = b.add(c.op, [local[i] for i in c.inputs], c.dtype, _subst(c.shape, dims),
                                    c.attrs, c.src)
            call_outputs[n.id] = [local[i] for i in tree_ids(callee.output)]
            continue
        if n.op is Op.PROJ:
            new[n.id] = call_outputs[n.inputs[0]][n.attr("index")]
            continue
        nid = b.add(n.op, [new[i] for i in n.inputs], n.dtype, n.shape, n.attrs, n.src)
        new[n.id] = nid
        if n.op is Op.PARAM:
            b.params.append(nid)
    b.inputs = [(name, new[i]) for name, i in graph.inputs]
    return replace(b.build(tree_map(graph.output, new.__getitem__)), params=tuple(new[p] for p in graph.params))


def inline(program: Program) -> Program:
    done: dict[str, Graph] = {}
    for name, fn in program.functions.items():      # callee-first order
        done[name] = _inline_graph(fn, done)
    return replace(program, main=_inline_graph(program.main, done), functions={})
