"""Products that only move values: one-hot products become table lookups, and casts of transposed
values are cast before the transpose.

- `cast(idx[:, None] == arange(V)[None, :], t) @ table` (std.nn's `embed`, written as a one-hot
  product so that autodiff gives the table its gradient) picks row `idx[i]` of `table` for each
  row `i`, or zeros where `idx[i]` is outside [0, V). It becomes
  `where(0 <= idx < V, gather(table, clamp(idx, 0, V - 1)), 0)`: the same values bit for bit (a
  product with one nonzero term of 1 rounds nowhere), read from N rows of the table instead of a
  [N, V] x [V, D] product. GPT-2's token embedding was a 632-GFLOP product with V = 50257 as its
  contraction dim (an odd row stride: 2.8 ms on an H200) and a one-hot kernel writing 823 MB.
  (A table holding an infinity is where they part: the product gives NaN, 0 x inf, in every row,
  where the lookup, like `F.embedding`, gives each row's own values.)
- `transpose(onehot) @ g` (the table's gradient, autodiff's transpose of that product) adds row
  `i` of `g` into row `idx[i]` of zeros [V, D]: `scatter_add(idx, g, rows=V)`, whose kernel
  (codegen/templates/scatter.py) sums each table row's tokens in a fixed order, so training stays
  deterministic without atomics, and skips the token blocks with no index in its rows. GPT-2's
  token embedding had a 823 MB one-hot [8192, 50257] written and then read by a 632-GFLOP
  product with M = 50257. The values are the product's (a sum of the same terms in float32,
  rounded once), except where `g` holds an infinity or NaN: the product spreads it as NaN
  (0 x inf) to every row, the scatter, like `F.embedding`'s gradient, only to its own row.
- `cast(transpose(x))` whose readers are all products is `transpose(cast(x))`: the cast kernel
  then writes in `x`'s order and the product reads the transposed view (either order is a tile
  load for it). A tied LM head's `x @ transpose(wte)` under a bfloat16 policy cast the transposed
  table into [D, V] with an odd row stride, which the product then read unaligned (3.6 ms against
  1.3 for the table read as stored); cast before the transpose, it is the same cast as the
  embedding's, and CSE keeps one.

Needs: a verified graph in program order. Leaves: the same values at every node id still read.
"""

from __future__ import annotations

from dataclasses import replace

from ...dtypes import FLOAT_DTYPES
from ..ir.graph import Node, Op, Program, tree_map
from ..ops.core import INTEGERS
from .rewrite import Inserter


def lookups(program: Program) -> Program:
    g = program.main
    by_id: dict[int, Node] = dict(g.by_id)
    users: dict[int, list[Node]] = {}
    for n in g.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    out: list[Node] = []
    alias: dict[int, int] = {}
    new = Inserter(by_id, out)         # nodes before the one being rewritten
    add, const = new.add, new.const

    for n in g.nodes:
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        by_id[n.id] = n
        if n.op is Op.MATMUL and (hit := _one_hot_rows(n, by_id)) is not None:
            idx, rows = hit                     # idx: [N, 1] integers; the table has `rows` rows
            src, dt = n.src, by_id[idx].dtype
            lo, hi = const(0, dt, src), const(rows - 1, dt, src)
            flat = add(Op.RESHAPE, (idx,), src, shape=(by_id[idx].shape[0],))
            clamped = add(Op.MAXIMUM, (add(Op.MINIMUM, (flat, hi), src), lo), src)
            inside = add(Op.AND, (add(Op.GE, (idx, lo), src), add(Op.LE, (idx, hi), src)), src)
            picked = add(Op.GATHER, (n.inputs[1], clamped), src)
            alias[n.id] = add(Op.WHERE, (inside, picked, const(0, n.dtype, src)), src)
            continue
        if n.op is Op.MATMUL and (hit := _one_hot_columns(n, by_id)) is not None:
            idx, rows = hit                     # A is transpose(onehot): [V, N], idx [N, 1]
            src = n.src
            flat = add(Op.RESHAPE, (idx,), src, shape=(by_id[idx].shape[0],))
            alias[n.id] = add(Op.SCATTER_ADD, (flat, n.inputs[1]), src, rows=rows)
            continue
        if n.op is Op.CAST and by_id[n.inputs[0]].op is Op.TRANSPOSE and _read_by_products(n.id, users):
            t = by_id[n.inputs[0]]
            cast = add(Op.CAST, (t.inputs[0],), n.src, n.dtype, **dict(n.attrs))
            alias[n.id] = add(Op.TRANSPOSE, (cast,), n.src, **dict(t.attrs))
            continue
        out.append(n)
    return program.replace_main(g.with_nodes(out, tree_map(g.output, lambda i: alias.get(i, i))))


def _read_by_products(nid: int, users: dict[int, list[Node]]) -> bool:
    """Whether `nid` is read, and only by products, directly or through transposes."""
    readers = users.get(nid, [])
    return bool(readers) and all(u.op is Op.MATMUL or (u.op is Op.TRANSPOSE and _read_by_products(u.id, users))
                                 for u in readers)


def _one_hot_rows(n: Node, by_id: dict[int, Node]) -> tuple[int, int] | None:
    """(idx, V) when `n` is `cast*(idx == iota(V)) @ table`: A [N, V] compares an integer [N, 1]
    value with a [1, V] IOTA (reshaped), V static (the clamp's bound is a constant), and the table
    is [V, D]; else None."""
    a, table = (by_id[i] for i in n.inputs)
    if len(a.shape) != 2 or len(table.shape) != 2 or a.dtype != table.dtype or n.dtype != table.dtype:
        return None
    hit = _one_hot(a, by_id)
    return hit if hit is not None and tuple(table.shape)[0] == hit[1] else None


def _one_hot_columns(n: Node, by_id: dict[int, Node]) -> tuple[int, int] | None:
    """(idx, V) when `n` is `transpose(onehot) @ g` (casts on either side of the transpose), the
    one-hot [N, V] as `_one_hot` reads it and g [N, D] of the product's dtype; else None."""
    a, g = (by_id[i] for i in n.inputs)
    if len(a.shape) != 2 or len(g.shape) != 2 or a.dtype != g.dtype or n.dtype != g.dtype:
        return None
    while a.op is Op.CAST and a.dtype in FLOAT_DTYPES:
        a = by_id[a.inputs[0]]
    if a.op is not Op.TRANSPOSE or len(a.shape) != 2:
        return None
    hit = _one_hot(by_id[a.inputs[0]], by_id)
    return hit if hit is not None and tuple(g.shape)[0] == tuple(by_id[hit[0]].shape)[0] else None


def _one_hot(a: Node, by_id: dict[int, Node]) -> tuple[int, int] | None:
    """(idx, V) when `a` is `cast*(idx == iota(V))` in a floating-point dtype: an integer [N, 1]
    value compared with a [1, V] IOTA (reshaped), V static; else None."""
    if len(a.shape) != 2 or a.dtype not in FLOAT_DTYPES:
        return None
    while a.op is Op.CAST:
        a = by_id[a.inputs[0]]
    if a.op is not Op.EQ:
        return None
    rows, cols = a.shape
    for x, y in (a.inputs, a.inputs[::-1]):
        xi, yi = by_id[x], by_id[y]
        if tuple(xi.shape) != (rows, 1) or xi.dtype not in INTEGERS or tuple(yi.shape) != (1, cols):
            continue
        iota = yi
        while iota.op is Op.RESHAPE:
            iota = by_id[iota.inputs[0]]
        if iota.op is Op.IOTA and tuple(iota.shape) == (cols,) and iota.dtype == xi.dtype and isinstance(cols, int):
            return x, cols
    return None


__all__ = ["lookups"]
