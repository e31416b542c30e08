"""An attention's output with other readers is read back from its merged heads, so the attention
kernel can write the merged heads and nothing else.

`o.transpose(1, 2).reshape(B, T, H * D)` is no view of `o`: some kernel must write the merged
heads. The scheduler lets the attention kernel write them itself (`codegen.placement.merged_heads`)
when the merge chain is the output's only reader. In a training step it is not: the backward pass
reads `o` again (attention's delta, `sum(dO * o)`), and under a precision policy the chain also
holds a round trip `cast_bf16(cast_f32(.))` (cast-views moved the float32 cast of `o` next to the
bfloat16 cast of the merged value). So GPT-2 small's step wrote every layer's output twice: the
attention kernel [B, H, T, D], then a cast-cast kernel the merged [B, T, H * D] (12 launches, 12.6
MB each way a layer), and kept both alive for the backward pass.

Here, for each attention output `y` (`flash.find_attention`) whose readers are one merge chain
(transposes and view reshapes, at most one exact round trip of casts, then the reshape that copies)
and other fusable readers:
- the round trip is dropped: `cast_n(cast_w(x))` with `x` of `cast_n`'s dtype and `cast_w` wider
  is `x` exactly;
- every other reader reads `y` as views of the merged value `m`: `m` reshaped back, then the chain's
  views undone in reverse (a transpose is its own inverse; a view reshape goes back to its input's
  shape). That is `y` element for element, read through strides.

Readers placed before `m` in program order move to just after it (with whatever reads them before
then). Only fusable readers (element-wise ops, row reductions, casts) are redirected: they read any
view through strides, where a product or a gather might not.

Needs: a verified graph in program order, after cast-views. Leaves: the same values at every node
id still read; the attention output's only reader is its merge chain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...dtypes import FLOAT_DTYPES, ITEMSIZE
from ..ir.graph import Node, Op, Program, tree_ids, tree_map
from ..ir.strides import contiguous_strides, view_strides
from ..ops import op_def
from .fork_casts import FUSABLE
from .flash import find_attention
from .rewrite import Inserter


@dataclass(frozen=True)
class Merge:
    y: int                      # the attention output
    views: tuple[int, ...]      # the chain's views from y up to (not including) the merging reshape
    fold: tuple[int, int] | None  # (cast_w, cast_n): the round trip dropped
    merged: int                 # the reshape that copies
    others: tuple[int, ...]     # y's other readers, redirected to views of `merged`


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _wider(a: str, b: str) -> bool:
    return a in FLOAT_DTYPES and b in FLOAT_DTYPES and ITEMSIZE[a] > ITEMSIZE[b]


# The dtypes the scheduler makes attention kernels of (schedule.ATTENTION_DTYPES): elsewhere the
# output stays a product's, whose readers are better off reading it where it is.
KERNEL_DTYPES = ("float16", "bfloat16", "float32")


def _plan(by_id: dict[int, Node], users: dict, outputs: set[int], y: Node) -> Merge | None:
    if y.id in outputs or not _static(y.shape) or not y.shape or y.dtype not in KERNEL_DTYPES:
        return None
    readers = list(dict.fromkeys(users.get(y.id, ())))
    heads = [u for u in readers if by_id[u].op in (Op.TRANSPOSE, Op.RESHAPE)]
    if len(heads) != 1:
        return None
    shape, strides = tuple(y.shape), contiguous_strides(y.shape)
    views: list[int] = []
    fold = None
    cur = y
    nxt = heads[0]
    while True:
        u = by_id[nxt]
        if u.id in outputs or not _static(u.shape):
            return None
        if u.op is Op.TRANSPOSE:
            a, b = (d % len(shape) for d in (u.attr("dim0"), u.attr("dim1")))
            s = list(strides)
            s[a], s[b] = s[b], s[a]
            strides = tuple(s)
            views.append(u.id)
        elif u.op is Op.RESHAPE:
            new = view_strides(shape, strides, tuple(u.shape))
            if new is None:
                break                                   # the reshape that copies: the merged heads
            strides = tuple(new)
            views.append(u.id)
        elif u.op is Op.CAST and fold is None and _wider(u.dtype, cur.dtype):
            after = users.get(u.id, ())
            n = by_id[after[0]] if len(after) == 1 else None
            if n is None or n.op is not Op.CAST or n.dtype != cur.dtype or n.id in outputs:
                return None
            fold = (u.id, n.id)
            u = n                                       # the round trip is the identity
        else:
            return None
        shape = tuple(u.shape)
        cur = u
        after = users.get(u.id, ())
        if len(after) != 1:
            return None
        nxt = after[0]
    others = tuple(r for r in readers if r != heads[0])
    if not others and fold is None:
        return None                                     # the scheduler's merged_heads has it already
    if any(r in outputs or op_def(by_id[r].op).kind not in FUSABLE for r in others):
        return None
    if by_id[nxt].dtype != y.dtype:
        return None
    return Merge(y.id, tuple(views), fold, nxt, others)


def merge_heads(program: Program) -> Program:
    g = program.main
    by_id = dict(g.by_id)
    users = g.users()
    outputs = set(tree_ids(g.output))
    plans = [p for y in find_attention(g) if (p := _plan(by_id, users, outputs, by_id[y])) is not None]
    if not plans:
        return program
    by_merged = {p.merged: p for p in plans}
    redirect = {r: p for p in plans for r in p.others}      # reader -> its plan
    dropped = {p.fold[0] for p in plans if p.fold}
    alias: dict[int, int] = {p.fold[1]: by_id[p.fold[0]].inputs[0] for p in plans if p.fold}
    inverse: dict[int, int] = {}                            # y -> its views of the merged value

    out: list[Node] = []
    new = Inserter(by_id, out)
    emitted: set[int] = set()
    waiting: list[Node] = []                                # readers (and theirs) moved after a merge

    def ready(n: Node) -> bool:
        p = redirect.get(n.id)
        return (p is None or p.y in inverse) and all(alias.get(i, i) in emitted for i in n.inputs
                                                     if not (p is not None and i == p.y))

    def emit(n: Node) -> None:
        p = redirect.get(n.id)
        ins = tuple(inverse[p.y] if p is not None and i == p.y else alias.get(i, i) for i in n.inputs)
        n = replace(n, inputs=ins)
        out.append(n)
        by_id[n.id] = n
        emitted.add(n.id)

    def undo(p: Merge) -> None:
        """`y` as views of the merged value: reshaped back, then the chain's views in reverse."""
        m = by_id[p.merged]
        before = by_id[alias.get(m.inputs[0], m.inputs[0])]
        cur = new.add(Op.RESHAPE, (m.id,), m.src, shape=tuple(before.shape))
        emitted.add(cur)
        for vid in reversed(p.views):
            v = by_id[vid]
            if v.op is Op.TRANSPOSE:
                cur = new.add(Op.TRANSPOSE, (cur,), v.src, dim0=v.attr("dim0"), dim1=v.attr("dim1"))
            else:
                cur = new.add(Op.RESHAPE, (cur,), v.src, shape=tuple(by_id[v.inputs[0]].shape))
            emitted.add(cur)
        inverse[p.y] = cur

    def blocked(n: Node) -> bool:
        held = {w.id for w in waiting}
        return any(alias.get(i, i) in held for i in n.inputs) or not ready(n)

    for n in g.nodes:
        if n.id in dropped or n.id in alias:
            continue                                        # the round trip's casts
        if blocked(n):
            waiting.append(n)
            continue
        emit(n)
        if n.id in by_merged:
            undo(by_merged[n.id])
            for w in list(waiting):                         # in program order: each after its inputs
                if not blocked(w):
                    waiting.remove(w)
                    emit(w)
    if waiting:
        raise AssertionError(f"merge-heads: nodes never placed: {[w.id for w in waiting][:8]}")
    g2 = g.with_nodes(out, tree_map(g.output, lambda i: alias.get(i, i)))
    return program.replace_main(g2)


__all__ = ["merge_heads"]
