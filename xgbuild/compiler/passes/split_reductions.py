"""Whole-tensor reductions in two stages, so they spread over the GPU.

The row-reduction kernel runs one program per row. A reduction of a whole tensor (`sum(x)`,
`dim` absent) is one row: one program on one SM walks every element. A GPT-2-small training
step's gradient-clipping norm sums the squares of each parameter's gradient, 38.6 M elements for
the token embedding alone, and each sum ran at one SM's bandwidth (the cost model: 5 ms for the
two MLP matrices' sums, whose bytes move in 0.08 ms at full bandwidth).

`sum(x)` of a tensor of rank >= 2 becomes `sum(sum(x, dim=-1))`: one program per row of the last
dim (thousands of rows), then one over the row results. `mean`, `max` and `min` the same way
(the rows are equally long, so the mean of row means is the mean). The order of the additions
is fixed by the shapes, so a run gives the same bits every time (no atomics); it differs from
the one-program order by rounding only. Only float32, float64 and integer inputs: a float16 or
bfloat16 reduction rounds its result to its dtype, and a rounded partial would add an error.

A reduction along a dim other than the last, of a long static extent (`sum(g, dim=0)` of a
[8192, 768] gradient: a bias's gradient), has few outputs (768), too few programs to fill the GPU
however each walks its column. The dim of extent R is split into [R / 64, 64] (a view of a value
a kernel made) and reduced over the 64 first, then over the R / 64: the first stage has R / 64
times the outputs, and both run in the row-reduction kernel's column form (`ROWS` adjacent
outputs a program, loads coalesced along them). Same dtypes, same fixed-order argument.

Where the reduced value is element-wise ops that only this reduction reads (LayerNorm's weight
gradient, `sum(cast(dy) * xhat, dim=0)`), the ops are rebuilt in the split shape over views of
their inputs, so the first stage computes them as its prologue: the product never goes to memory
(it was written and read back, 50 MB a LayerNorm at GPT-2 small's [8192, 768] in float32).
A value read by the sum and by casts of it alone (the MLP's bias gradient: the tanh GELU's 45-op
gradient, summed over the tokens in float32 and cast to bfloat16 for the products) is rebuilt the
same way with its casts, and each cast's readers read a view of the split cast: the first stage
computes the gradient, writes the cast through its strides and sums, so the float32 gradient
never goes to memory (on an H200, GPT-2 small's [8192, 3072]: 55.6 us a layer, where an
element-wise kernel writing both and the first stage reading the float32 back took 62.6 + 27.4).
A value others read too (not only casts) is split through a view of it: recomputing the MLP's bias
gradient from its two bfloat16 inputs in the first stage, so that only the bfloat16 cast need be
written by the element-wise kernel, was measured slower (1.14 against 1.07 ms a step).

Needs: a verified graph in program order, shapes static where it splits. Leaves: the same value
at the reduction's node id.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from ..ir.graph import BINARY, UNARY, Node, Op, Program, attrs_of, tree_ids

SPLIT = (Op.SUM, Op.MEAN, Op.MAX, Op.MIN)
DTYPES = {"float32", "float64", "int8", "int16", "int32", "int64", "uint8"}
MIN_NUMEL = 1 << 16        # below this one program is as quick as two launches
MIN_ROWS = 8               # a first stage of fewer rows than this does not spread


def _splits(n: Node, x: Node) -> bool:
    if n.op not in SPLIT or n.attr("dim") is not None or x.dtype not in DTYPES or n.dtype != x.dtype:
        return False
    shape = tuple(x.shape)
    if len(shape) < 2 or not all(isinstance(s, int) for s in shape):
        return False
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows >= MIN_ROWS and rows * shape[-1] >= MIN_NUMEL and shape[-1] > 1


COLUMN_CHUNK = 64              # a strided reduction's first stage reduces runs of this many
MIN_COLUMN = 1024              # below this extent one stage has programs enough
MAX_COLUMN_OUTPUTS = 1 << 16   # more outputs than this already fill the GPU
VIEWS = {Op.RESHAPE, Op.TRANSPOSE, Op.INDEX}
POINTWISE = UNARY | BINARY | {Op.WHERE}     # ops of one element each, rebuilt in the split shape


def _dense(x: Node, by_id: dict[int, Node]) -> bool:
    """A value a kernel made (or an input), or reshapes of one: any reshape of it is a view."""
    while x.op is Op.RESHAPE:
        x = by_id[x.inputs[0]]
    return x.op not in VIEWS


def _chain(n: Node, by_id: dict[int, Node], users: dict[int, list[int]], outputs: set[int],
           position: dict[int, int]) -> tuple[list[int], list[int]] | None:
    """The element-wise nodes of the shape n reduces that make its input x for n alone (every user
    of each is n or another of them), when every value they read from outside either broadcasts
    along n's dim or is dense (so the split is a view of it); None when there are none. With them,
    x's casts (`exports`): x may be read by n and by casts of it alone (the MLP's bias gradient, a
    float32 sum of the GELU gradient whose bfloat16 cast feeds the products), each rebuilt in the
    split shape too, so that the first stage writes the cast and the float32 value stays in
    registers."""
    x = by_id[n.inputs[0]]
    shape = tuple(x.shape)

    def own(i: int) -> bool:
        v = by_id[i]
        return v.op in POINTWISE and tuple(v.shape) == shape and i not in outputs

    exports = sorted({u for u in users[x.id] if u != n.id}, key=position.__getitem__)
    if not own(x.id) or n.id not in users[x.id] or any(
            by_id[u].op is not Op.CAST or tuple(by_id[u].shape) != shape for u in exports):
        return None
    chain: set[int] = set()
    heap = [(-position[x.id], x.id)]
    leaves: set[int] = set()
    while heap:             # latest first: every user in the chain is decided before its input
        _, m = heapq.heappop(heap)
        if m in chain or m in leaves:
            continue
        if m != x.id and not (own(m) and all(u in chain for u in users[m])):
            leaves.add(m)
            continue
        chain.add(m)
        for i in by_id[m].inputs:
            heapq.heappush(heap, (-position[i], i))
    d = n.attr("dim") % len(shape)
    for v in (by_id[i] for i in leaves):
        if len(v.shape) > len(shape) or (_split_view(v, len(shape), d) is not None and not _dense(v, by_id)):
            return None
    return sorted(chain, key=position.__getitem__), exports


def _split_view(v: Node, rank: int, d: int) -> tuple | None:
    """v's shape with dim d of a rank-`rank` value split into runs (None: v broadcasts along it,
    or does not reach that dim, and is read as it is)."""
    shape = tuple(v.shape)
    k = d - (rank - len(shape))
    if k < 0 or shape[k] == 1:
        return None
    return shape[:k] + (shape[k] // COLUMN_CHUNK, COLUMN_CHUNK) + shape[k + 1:]


def _column_split(n: Node, x: Node) -> int | None:
    """The dim (normalised) of a reduction along a strided dim worth two stages, else None. (Its
    first stage reads x through a view, which must be dense, or x's ops rebuilt: the caller's.)"""
    dim = n.attr("dim")
    if n.op not in SPLIT or dim is None or x.dtype not in DTYPES or n.dtype != x.dtype:
        return None
    shape = tuple(x.shape)
    if not shape:
        return None
    d = dim % len(shape)
    # The split dim must be static; the others may be symbolic (counted as one output each).
    outputs = 1
    for k, s in enumerate(shape):
        outputs *= s if k != d and isinstance(s, int) else 1
    if d == len(shape) - 1 or not isinstance(shape[d], int) or shape[d] < MIN_COLUMN or shape[d] % COLUMN_CHUNK \
            or outputs > MAX_COLUMN_OUTPUTS:
        return None
    return d


def split_reductions(program: Program) -> Program:
    g = program.main
    by_id = g.by_id
    users = g.users()
    outputs = set(tree_ids(g.output))
    position = {n.id: k for k, n in enumerate(g.nodes)}
    next_id = max((n.id for n in g.nodes), default=-1) + 1

    def new_id() -> int:
        nonlocal next_id
        next_id += 1
        return next_id - 1

    # The strided reductions split in two, each with its rebuilt chain and casts (or None: a view
    # of the value a kernel made), by the node where the rebuilt values go: the first of the
    # reduction and its casts in program order (a cast may come before the reduction, and its
    # readers before the reduction too).
    column: dict[int, tuple[Node, int, tuple | None]] = {}
    at: dict[int, int] = {}
    for n in g.nodes:
        if n.inputs and not _splits(n, by_id[n.inputs[0]]) \
                and (d := _column_split(n, x := by_id[n.inputs[0]])) is not None \
                and ((plan := _chain(n, by_id, users, outputs, position)) is not None or _dense(x, by_id)):
            column[n.id] = (n, d, plan)
            at[min([n.id] + (plan[1] if plan else []), key=position.__getitem__)] = n.id
    exported = {c for _n, _d, plan in column.values() if plan for c in plan[1]}
    dropped = {c for _n, _d, plan in column.values() if plan for c in plan[0]}
    first_of: dict[int, int] = {}       # reduction -> its first stage

    def rebuild(n: Node, d: int, plan: tuple | None) -> list[Node]:
        """The first stage of n and what it reads: a view of x, or x's ops over views of theirs."""
        x = by_id[n.inputs[0]]
        shape = tuple(x.shape)
        runs = _split_view(x, len(shape), d)    # (x is at least MIN_COLUMN long along d)
        made: list[Node] = []
        if plan is None:        # a view of the value a kernel made
            split = new_id()
            made.append(Node(split, Op.RESHAPE, (x.id,), x.dtype, runs, (), n.src))
        else:                   # its element-wise ops rebuilt over views of their inputs
            chain, casts = plan
            new: dict[int, int] = {}
            for m in (by_id[c] for c in chain + casts):
                ins = []
                for i in m.inputs:
                    if i in new:        # a rebuilt node, or a leaf's view made already
                        ins.append(new[i])
                    elif (vshape := _split_view(by_id[i], len(shape), d)) is None:
                        ins.append(i)
                    else:
                        new[i] = new_id()
                        made.append(Node(new[i], Op.RESHAPE, (i,), by_id[i].dtype, vshape, (), m.src))
                        ins.append(new[i])
                new[m.id] = new_id()
                made.append(Node(new[m.id], m.op, tuple(ins), m.dtype, runs, m.attrs, m.src))
            # Each cast's readers read the rebuilt cast through a view of the cast's own shape.
            made += [Node(c, Op.RESHAPE, (new[c],), by_id[c].dtype, shape, (), by_id[c].src) for c in casts]
            split = new[x.id]
        first_of[n.id] = new_id()
        made.append(Node(first_of[n.id], n.op, (split,), n.dtype, runs[:d + 1] + runs[d + 2:],
                         attrs_of(dim=d + 1, keepdim=False), n.src))
        return made

    out: list[Node] = []
    for n in g.nodes:
        if n.id in at:
            out += rebuild(*column[at[n.id]])
        if n.id in exported or n.id in dropped:
            continue
        if n.inputs and _splits(n, by_id[n.inputs[0]]):
            x = by_id[n.inputs[0]]
            keep = bool(n.attr("keepdim", False))
            shape = tuple(x.shape)[:-1] + ((1,) if keep else ())
            rows = Node(new_id(), n.op, (x.id,), n.dtype, shape, attrs_of(dim=len(x.shape) - 1, keepdim=keep), n.src)
            out.append(rows)
            n = replace(n, inputs=(rows.id,))
        elif n.id in column:
            d = column[n.id][1]
            n = replace(n, inputs=(first_of[n.id],), attrs=attrs_of(dim=d, keepdim=bool(n.attr("keepdim", False))))
        out.append(n)
    return program.replace_main(g.with_nodes(out, g.output))


__all__ = ["split_reductions"]
