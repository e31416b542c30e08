"""Products read only transposed are computed transposed: `transpose(a @ b)` is `bT @ aT`.

A tied LM head's weight gradient is `transpose(x) @ dlogits`, [D, V], and the table reads it as
`transpose` of that, [V, D]: the gradient-norm kernel and the optimizer then walked a [V, D] value
whose rows are strided columns of the product (one element of each 32-byte sector; GPT-2 small's
sum of squares took 0.22 ms on an H200 for 77 MB). Written as `transpose(dlogits) @ x`, the product
is [V, D] in the table's own order, and its readers read rows.

Applies to a product every reader of which is a transpose of its last two dims, directly or after
an INDEX of slices (pad-products' view of the first V columns of a padded product): each such
reader becomes the new product, or its INDEX with the last two items swapped. The operands are the
old ones transposed: a transpose of a transpose is its input, else a transpose view. The values
are the same sums of the same products (the kernel's tiling, and with it the order of the float32
additions, may differ: rounding only).

Needs: a graph in program order after pad-products. Leaves: the same values at every node id
still read; no dead nodes.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Node, Op, Program, tree_ids, tree_map
from .rewrite import Inserter


def _swaps_last(n: Node) -> bool:
    rank = len(n.shape)
    if n.op is not Op.TRANSPOSE or rank < 2:
        return False
    return {n.attr("dim0") % rank, n.attr("dim1") % rank} == {rank - 2, rank - 1}


def _slices(n: Node) -> bool:
    return n.op is Op.INDEX and len(n.inputs) == 1 and all(it[0] == "s" for it in n.attr("items"))


def _readers(m: Node, users: dict[int, list[Node]], outputs: set[int]) -> list[tuple[Node, Node | None]] | None:
    """(transpose, the INDEX between or None) for each reader of product m, when every reader
    reads it transposed (a transpose returned is the new product returned); else None."""
    found: list[tuple[Node, Node | None]] = []
    if m.id in outputs or not users.get(m.id):
        return None
    for u in users[m.id]:
        if _swaps_last(u):
            found.append((u, None))
        elif _slices(u) and u.id not in outputs and users.get(u.id) and all(_swaps_last(t) for t in users[u.id]):
            found.extend((t, u) for t in users[u.id])
        else:
            return None
    return found


def transpose_products(program: Program) -> Program:
    g = program.main
    outputs = set(tree_ids(g.output))
    users: dict[int, list[Node]] = {}
    for n in g.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    by_id: dict[int, Node] = dict(g.by_id)
    out: list[Node] = []
    new = Inserter(by_id, out)
    alias: dict[int, int] = {}
    dropped: set[int] = set()
    for n in g.nodes:
        if n.id in dropped:
            continue
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        by_id[n.id] = n
        readers = _readers(n, users, outputs) if n.op is Op.MATMUL and len(n.shape) >= 2 else None
        if readers is None:
            out.append(n)
            continue
        rank = len(n.shape)

        def swapped(i: int) -> int:
            x = by_id[i]
            if _swaps_last(x):
                return x.inputs[0]
            return new.add(Op.TRANSPOSE, (i,), n.src, dim0=rank - 2, dim1=rank - 1)
        a, b = n.inputs
        prod = new.add(Op.MATMUL, (swapped(b), swapped(a)), n.src, **dict(n.attrs))
        views: dict[int, int] = {}
        for t, index in readers:
            if index is None:
                alias[t.id] = prod
            else:
                if index.id not in views:
                    items = tuple(index.attr("items"))
                    views[index.id] = new.add(Op.INDEX, (prod,), index.src,
                                              items=items[:-2] + (items[-1], items[-2]))
                    dropped.add(index.id)
                alias[t.id] = views[index.id]
            dropped.add(t.id)
    if not dropped:
        return program
    return program.replace_main(g.with_nodes(out, tree_map(g.output, lambda i: alias.get(i, i))))
