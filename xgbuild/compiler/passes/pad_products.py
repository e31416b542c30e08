"""Large products with an odd row pitch run padded to an aligned one.

A product whose contraction dim K or output dim N is not a whole number of 16 bytes (GPT-2's
50257-word vocabulary: 100514-byte bfloat16 rows) has operand or output rows that start at odd
addresses: no 16-byte vector loads, no tensor descriptors (TMA), a masked tail on every k-step.
On an H200 the tied LM head's gradient products took 2.63 ms (dX, K = 50257) and 3.27 ms (the
weight's, N = 50257) against 1.11 ms for the forward product of the same size.

Here such a product reads its operands zero-padded to a multiple of PITCH_BYTES along the odd
dims (UNINDEX: each element from its source or zero; a transposed operand padded before its
transpose) and writes its output padded along N; the product's readers see the first N columns
(INDEX, a view: they read through its aligned row stride), and a lone float cast of the output is
taken padded, in the product's epilogue, before the view. An element-wise value that only products
read is not copied: its expression is computed over the padded shape and masked to zero past its
extent (the logits' gradient, read through the padded logits, written padded by one kernel). The
values are the same bit for bit: the extra k terms are products with zero rows or columns (exact
zeros added to the sums) and the extra output columns are never read. A value padded for several
products is padded once (the logits' gradient is both the A of dX and the B of the weight's
gradient).

Only products of at least MIN_FLOPS with an odd dim of at least MIN_DIM are padded: the copy of
a padded operand costs a pass over it, which pays only where the product is large.

Needs: a graph after autodiff and CSE (the gradient products present, duplicates merged), with
static sizes (symbolic dims are left alone). Leaves: the same values at every node id still read;
padded products, their padded operands and INDEX views of their outputs; no dead nodes.
"""

from __future__ import annotations

from dataclasses import replace

from ...dtypes import FLOAT_DTYPES, ITEMSIZE
from ..ir.graph import Node, Op, Program, tree_ids, tree_map
from ..ops import BINARY, UNARY
from .dce import dce
from .rewrite import FULL, Inserter

ELEMENTWISE = UNARY | BINARY | {Op.WHERE}

PITCH_BYTES = 128          # a padded row holds whole 128-byte lines (TMA's and a swizzle's unit)
MIN_FLOPS = 1e10           # products below this keep their shapes
MIN_DIM = 1024             # and so do odd dims shorter than this


def _odd(size, itemsize: int) -> bool:
    return isinstance(size, int) and size >= MIN_DIM and size * itemsize % 16 != 0


def _padded(size: int, itemsize: int) -> int:
    step = PITCH_BYTES // itemsize
    return -(-size // step) * step


def pad_products(program: Program) -> Program:
    g = program.main
    by_id: dict[int, Node] = dict(g.by_id)
    out: list[Node] = []
    alias: dict[int, int] = {}
    padded: dict[tuple[int, tuple], int] = {}       # (value, its padded shape) -> the padded value
    users = g.users()
    new = Inserter(by_id, out)
    add = new.add

    def pad(x: int, shape: tuple[int, int], src) -> int:
        """`x` (2-D) zero-padded to `shape`; a transpose is padded below itself, and an
        element-wise value that only products read is computed padded (`computed_padded`)."""
        node = by_id[x]
        if tuple(node.shape) == shape:
            return x
        key = (x, shape)
        if key not in padded:
            if node.op is Op.TRANSPOSE and len(by_id[node.inputs[0]].shape) == 2:
                inner = pad(node.inputs[0], shape[::-1], src)
                padded[key] = add(Op.TRANSPOSE, (inner,), src, **dict(node.attrs))
            elif node.op in ELEMENTWISE and all(by_id[u].op is Op.MATMUL for u in users.get(x, ())):
                padded[key] = computed_padded(x, shape, src)
            else:
                padded[key] = copy_padded(x, shape, src)
        return padded[key]

    def copy_padded(x: int, shape: tuple, src) -> int:
        items = tuple(FULL if want == have else ("s", 0, have, 1) for have, want in zip(by_id[x].shape, shape))
        return add(Op.UNINDEX, (x,), src, shape=shape, items=items)

    def computed_padded(x: int, shape: tuple, src) -> int:
        """`x`'s element-wise expression evaluated over the padded shape and masked to zero past
        `x`'s own extent: one kernel writes the padded value, where a copy would read and write
        it again (GPT-2's logits' gradient: 0.53 ms on an H200). The expression reads each of its
        inputs padded too: a view of a padded product's output as that output, a broadcast input
        as it is, a FULL made at the padded shape, anything else copied padded; what the padded
        positions hold before the mask does not matter."""
        have = tuple(by_id[x].shape)
        memo: dict[int, int] = {}

        def widened(v: int) -> int:
            node = by_id[v]
            vs = tuple(node.shape)
            # v's dims right-aligned on the padded shape, a broadcast (size-1) dim kept so
            want = tuple(1 if a == 1 else b for a, b in zip(vs, shape[len(shape) - len(vs):]))
            if want == vs:
                return v
            if v in memo:
                return memo[v]
            base = by_id[node.inputs[0]] if node.inputs else None
            if node.op is Op.INDEX and base is not None and tuple(base.shape) == want and all(
                    item == FULL or (item[0] == "s" and item[1] in (0, None) and item[3] in (1, None))
                    for item in node.attr("items")):
                out = base.id                                   # the padded product's own output
            elif node.op is Op.FULL:
                out = add(Op.FULL, (), node.src, shape=want, dtype=node.dtype, **dict(node.attrs))
            elif (iota := _arange_along(node, by_id)) is not None and sum(d != 1 for d in want) == 1:
                # An arange (one-hot's `arange(V)`): an arange of the padded length, which a
                # kernel computes from its index where a padded copy is read from memory.
                longer = add(Op.IOTA, (), node.src, shape=(max(want),), dtype=iota.dtype)
                out = longer if want == (max(want),) else add(Op.RESHAPE, (longer,), node.src, shape=want)
            elif node.op in ELEMENTWISE and node.inputs:
                out = add(node.op, tuple(widened(i) for i in node.inputs), node.src, dtype=node.dtype,
                          **dict(node.attrs))
            else:
                out = copy_padded(v, want, node.src)
            memo[v] = out
            return out

        inside = None
        for d, (a, b) in enumerate(zip(have, shape)):
            if a == b:
                continue
            iota = add(Op.IOTA, (), src, shape=(b,), dtype="int64")
            dims = tuple(b if e == d else 1 for e in range(len(shape)))
            lane = add(Op.RESHAPE, (iota,), src, shape=dims)
            below = add(Op.LT, (lane, new.const(a, "int64", src)), src)
            inside = below if inside is None else add(Op.AND, (inside, below), src)
        return add(Op.WHERE, (inside, widened(x), new.const(0, by_id[x].dtype, src)), src)

    for n in g.nodes:
        if n.id in alias:               # a cast already taken into a padded product's epilogue
            continue
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        by_id[n.id] = n
        sizes = _odd_dims(n, by_id)
        if sizes is None:
            out.append(n)
            continue
        (m, k, nn), (kp, np_) = sizes
        a = pad(n.inputs[0], (m, kp), n.src)
        b = pad(n.inputs[1], (kp, np_), n.src)
        product = add(Op.MATMUL, (a, b), n.src, **dict(n.attrs))
        if np_ == nn:
            alias[n.id] = product
            continue
        # A product read by one cast alone (a gradient widened to float32) is cast padded, in the
        # product's epilogue, and the view taken of the cast.
        readers = [by_id[u] for u in users.get(n.id, ())]
        viewed = n.id
        if len(readers) == 1 and readers[0].op is Op.CAST and n.id not in tree_ids(g.output):
            viewed, product = readers[0].id, add(Op.CAST, (product,), readers[0].src, dtype=readers[0].dtype,
                                                  **dict(readers[0].attrs))
        alias[viewed] = add(Op.INDEX, (product,), n.src, items=(FULL, ("s", 0, nn, 1)))
    # (The values computed padded leave their originals unread.)
    return dce(program.replace_main(g.with_nodes(out, tree_map(g.output, lambda i: alias.get(i, i)))))


def _arange_along(node: Node, by_id: dict[int, Node]) -> Node | None:
    """The 1-D IOTA that `node` is, or is a reshape of along its one non-unit dim; else None."""
    while node.op is Op.RESHAPE and sum(d != 1 for d in node.shape) == 1:
        node = by_id[node.inputs[0]]
    return node if node.op is Op.IOTA and len(node.shape) == 1 else None


def _odd_dims(n: Node, by_id: dict[int, Node]) -> tuple[tuple[int, int, int], tuple[int, int]] | None:
    """((M, K, N), (padded K, padded N)) for a 2-D product worth padding, else None."""
    if n.op is not Op.MATMUL or len(n.inputs) != 2:
        return None
    a, b = (by_id[i] for i in n.inputs)
    if len(a.shape) != 2 or len(b.shape) != 2 or a.dtype not in FLOAT_DTYPES:
        return None
    (m, k), (_, nn) = a.shape, b.shape
    if not all(isinstance(d, int) for d in (m, k, nn)) or 2.0 * m * k * nn < MIN_FLOPS:
        return None
    size = ITEMSIZE[a.dtype]
    kp = _padded(k, size) if _odd(k, size) else k
    np_ = _padded(nn, size) if _odd(nn, size) else nn
    return None if (kp, np_) == (k, nn) else ((m, k, nn), (kp, np_))


__all__ = ["pad_products"]
