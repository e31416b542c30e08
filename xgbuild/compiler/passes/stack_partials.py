"""Stacked gradients sum their layers' partial sums in one reduction.

A stacked parameter read a layer at a time (`b2[l]` of a [L, C] tensor) gets its gradient as a sum
of placements, `unindex(g_0, l=0) + unindex(g_1, l=1) + ...`, one per layer. Where each layer's
g_l is the second stage of a split reduction (split-reductions: a bias's gradient over 8192 tokens
is `sum(sum(view, dim=1), dim=0)`, the first stage [128, C] partial sums), every layer ended in a
row kernel of its own summing 128 rows: GPT-2 small's step had 98 of them, 5 us each on an H200 for
a few hundred KB, launch latency rather than work.

Here such a sum of placements becomes `sum(unindex(p_0, l=0) + unindex(p_1, l=1) + ..., dim=1)`:
each layer's partials [P, C] placed into [L, P, C], then one reduction over P for every layer at
once. The values are the same sums of the same partials in a fixed order (the additions of P
partials in another association: rounding only); nothing is added that is not an exact zero.

Applies to a tree of ADDs of one shape [L, *C] (each inner ADD read only by the next), whose leaves
are at least two UNINDEXes that each place a `sum(p, dim=0)` (read by nothing else) of partials
of one shape [P, *C] at an integer index of dim 0.

Needs: a graph in program order after split-reductions. Leaves: the tree's root at its own id;
the old placements and second stages gone.
"""

from __future__ import annotations

from ..ir.graph import Node, Op, Program, attrs_of, tree_ids


def _second_stage(u: Node, by_id: dict[int, Node], users: dict[int, list[int]]) -> Node | None:
    """The partials [P, *C] that UNINDEX u places the sum of, when u places `sum(p, dim=0)` (read
    by u alone) at an integer index of its dim 0, the rest whole; else None."""
    if u.op is not Op.UNINDEX or len(u.inputs) != 1:
        return None
    items = u.attr("items")
    if len(items) != 1 or items[0][0] != "i" or not isinstance(items[0][1], int):
        return None
    s = by_id[u.inputs[0]]
    if s.op is not Op.SUM or s.attr("dim") != 0 or s.attr("keepdim", False) or users[s.id] != [u.id]:
        return None
    p = by_id[s.inputs[0]]
    if len(p.shape) != len(u.shape) or tuple(p.shape[1:]) != tuple(u.shape[1:]) or p.dtype != u.dtype:
        return None
    return p


def stack_partials(program: Program) -> Program:
    g = program.main
    by_id = g.by_id
    users = g.users()
    outputs = set(tree_ids(g.output))

    # In program order (inputs first), each ADD whose two inputs are placements of second stages
    # or such ADDs read by it alone: the partials' shape under it (one pass, no recursion: an ADD
    # chain may be thousands long).
    partials: dict[int, tuple] = {}         # valid tree node -> the shape of its leaves' partials

    def child(x: int, shape: tuple) -> tuple | None:
        n = by_id[x]
        if tuple(n.shape) != shape or len(users[x]) != 1 or x in outputs:
            return None
        if n.op is Op.ADD:
            return partials.get(x)
        p = _second_stage(n, by_id, users)
        return tuple(p.shape) if p is not None else None

    inner: set[int] = set()                 # tree nodes read by a bigger tree
    for n in g.nodes:
        if n.op is not Op.ADD or len(n.inputs) != 2:
            continue
        shape = tuple(n.shape)
        a, b = (child(x, shape) for x in n.inputs)
        if a is not None and a == b:
            partials[n.id] = a
            inner.update(x for x in n.inputs if by_id[x].op is Op.ADD)
    roots = [r for r in partials if r not in inner]
    if not roots:
        return program

    def tree(root: int) -> list[int]:
        """The tree's nodes, inputs before readers (an iterative post-order walk)."""
        order, stack = [], [(root, False)]
        while stack:
            i, done = stack.pop()
            if done or by_id[i].op is not Op.ADD:
                order.append(i)
                continue
            stack.append((i, True))
            stack.extend((x, False) for x in reversed(by_id[i].inputs))
        return order

    trees = {r: tree(r) for r in roots}
    dropped: set[int] = set()
    for r, nodes in trees.items():
        for i in nodes:
            if i != r:
                dropped.add(i)
            if by_id[i].op is Op.UNINDEX:
                dropped.add(by_id[i].inputs[0])     # its second stage
    next_id = max(by_id) + 1
    out: list[Node] = []
    for n in g.nodes:
        if n.id in dropped:
            continue
        if n.id not in trees:
            out.append(n)
            continue
        twin: dict[int, Node] = {}          # tree node -> its stacked twin
        for i in trees[n.id]:
            m = by_id[i]
            if m.op is Op.UNINDEX:
                p = _second_stage(m, by_id, users)
                t = Node(next_id, Op.UNINDEX, (p.id,), m.dtype, (m.shape[0],) + tuple(p.shape), m.attrs, m.src)
            else:
                a, b = (twin[x] for x in m.inputs)
                t = Node(next_id, Op.ADD, (a.id, b.id), m.dtype, tuple(a.shape), m.attrs, m.src)
            next_id += 1
            out.append(t)
            twin[i] = t
        out.append(Node(n.id, Op.SUM, (twin[n.id].id,), n.dtype, tuple(n.shape), attrs_of(dim=1, keepdim=False), n.src))
    return program.replace_main(g.with_nodes(out, g.output))


__all__ = ["stack_partials"]
