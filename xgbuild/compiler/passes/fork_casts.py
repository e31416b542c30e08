"""A widening cast, or a tensor made from nothing, is recomputed by each kernel that reads it,
never written to memory for them.

`cast(x)` from a narrower float (bfloat16, float16) to a wider one is exact and one instruction;
reading `x` costs half the bytes of reading the cast's value, and not writing that value saves as
much again. When one cast has several element-wise or row-reduction readers, the scheduler puts
it in one kernel and the others read its output from memory: GPT-2's cross-entropy wrote its
[8192, 50257] logits as float32 (1.6 GB) for the log-sum-exp kernel to read back. Here each such
reader gets a cast of its own (the first keeps the original), so each kernel starts from the
narrow value. Readers that take no prologue (products, views, attention, gathers, scatters,
PyTorch operators) keep reading the original.

A `full` or `iota` of more than one element is cheaper still: it reads nothing. Autodiff makes
them (the gradient of a broadcast adds its [R, 1] value to a `full(0)` of [R, D]); CSE leaves one
per shape, and the scheduler put it in the first kernel that read it: GPT-2's training step wrote
a [8192, 768] tensor of zeros and two dozen kernels read it back. Each fusable reader gets its
own copy, placed just before it (a copy for a recomputed reader is marked recomputed too, so that
it may join that reader's kernel).

Needs: a graph after CSE (which would merge the copies back). Leaves: the same values; more
nodes, each cast or source read by at most one fusable reader.
"""

from __future__ import annotations

from dataclasses import replace

from ...dtypes import FLOAT_DTYPES, ITEMSIZE
from ..ir.graph import Node, Op, Program
from ..ir.shapes import numel
from ..ops import Kind, op_def

FUSABLE = (Kind.UNARY, Kind.BINARY, Kind.SELECT, Kind.REDUCE, Kind.NORMALIZE)


def _widening(n: Node, by_id: dict[int, Node]) -> bool:
    if n.op is not Op.CAST or not n.shape:
        return False
    src = by_id[n.inputs[0]]
    return src.dtype in FLOAT_DTYPES and n.dtype in FLOAT_DTYPES and ITEMSIZE[src.dtype] < ITEMSIZE[n.dtype]


def _source(n: Node) -> bool:
    return n.op in (Op.FULL, Op.IOTA) and numel(n.shape) != 1


def fork_casts(program: Program) -> Program:
    g = program.main
    by_id = g.by_id
    readers: dict[int, list[int]] = {}
    for n in g.nodes:
        if op_def(n.op).kind in FUSABLE:
            for i in dict.fromkeys(n.inputs):
                if _widening(by_id[i], by_id) or _source(by_id[i]):
                    readers.setdefault(i, []).append(n.id)
    forks = {c: users[1:] for c, users in readers.items() if len(users) > 1}
    if not forks:
        return program
    before: dict[int, list[int]] = {}      # reader -> the sources whose copies go just before it
    for v, rs in forks.items():
        if _source(by_id[v]):
            for r in rs:
                before.setdefault(r, []).append(v)
    next_id = max(by_id) + 1
    copy_for: dict[tuple[int, int], int] = {}       # (cast or source, reader) -> its own copy
    out: list[Node] = []

    def fork(v: Node, reader: Node) -> None:
        nonlocal next_id
        attrs = v.attrs
        if _source(v) and reader.attr("remat") is not None and v.attr("remat") is None:
            attrs = tuple(sorted(attrs + (("remat", reader.attr("remat")),)))
        out.append(replace(v, id=next_id, attrs=attrs))
        copy_for[(v.id, reader.id)] = next_id
        next_id += 1

    for n in g.nodes:
        for v in before.get(n.id, ()):
            fork(by_id[v], n)
        if any((i, n.id) in copy_for for i in n.inputs):
            n = replace(n, inputs=tuple(copy_for.get((i, n.id), i) for i in n.inputs))
        out.append(n)
        if not _source(n):
            for reader in forks.get(n.id, ()):  # a cast's copies: just after it
                fork(n, by_id[reader])
    return program.replace_main(g.with_nodes(out, g.output))


__all__ = ["fork_casts"]
