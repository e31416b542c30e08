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
A value others read too is split through a view of it: recomputing the MLP's bias gradient
from its two bfloat16 inputs in the first stage (the tanh GELU's 45-op gradient), so that only
the bfloat16 cast need be written, was measured slower on an H200 (1.14 against 1.07 ms a step);
so was computing it only there, the first stage writing the bfloat16 cast for the products as
well as its sums (one kernel instead of two: 101.9 us a layer against 62.6 + 27.6, the column
form's [8, 64] tiles walking the chain with few elements in flight).

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
           position: dict[int, int]) -> list[int] | None:
    """The element-wise nodes of the shape n reduces that make its input for n alone (every user
    of each is n or another of them), when every value they read from outside either broadcasts
    along n's dim or is dense (so the split is a view of it); None when there are none."""
    x = by_id[n.inputs[0]]
    shape = tuple(x.shape)

    def own(i: int) -> bool:
        v = by_id[i]
        return v.op in POINTWISE and tuple(v.shape) == shape and i not in outputs

    if not own(x.id) or users[x.id] != [n.id]:
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
    return sorted(chain, key=position.__getitem__)


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
    out: list[Node] = []
    dropped: set[int] = set()           # element-wise nodes rebuilt in a split shape
    for n in g.nodes:
        if n.inputs and _splits(n, by_id[n.inputs[0]]):
            x = by_id[n.inputs[0]]
            keep = bool(n.attr("keepdim", False))
            shape = tuple(x.shape)[:-1] + ((1,) if keep else ())
            rows = Node(next_id, n.op, (x.id,), n.dtype, shape, attrs_of(dim=len(x.shape) - 1, keepdim=keep), n.src)
            next_id += 1
            out.append(rows)
            n = replace(n, inputs=(rows.id,))
        elif n.inputs and (d := _column_split(n, x := by_id[n.inputs[0]])) is not None \
                and ((chain := _chain(n, by_id, users, outputs, position)) is not None or _dense(x, by_id)):
            shape = tuple(x.shape)
            runs = _split_view(x, len(shape), d)    # (x is at least MIN_COLUMN long along d)
            if chain is None:       # a view of the value a kernel made
                out.append(Node(next_id, Op.RESHAPE, (x.id,), x.dtype, runs, (), n.src))
                split, next_id = next_id, next_id + 1
            else:                   # its element-wise ops rebuilt over views of their inputs
                new: dict[int, int] = {}
                for m in (by_id[c] for c in chain):
                    ins = []
                    for i in m.inputs:
                        if i in new:        # a rebuilt node, or a leaf's view made already
                            ins.append(new[i])
                        elif (vshape := _split_view(by_id[i], len(shape), d)) is None:
                            ins.append(i)
                        else:
                            out.append(Node(next_id, Op.RESHAPE, (i,), by_id[i].dtype, vshape, (), m.src))
                            new[i] = next_id
                            ins.append(next_id)
                            next_id += 1
                    out.append(Node(next_id, m.op, tuple(ins), m.dtype, runs, m.attrs, m.src))
                    new[m.id] = next_id
                    next_id += 1
                dropped |= set(chain)
                split = new[x.id]
            first = Node(next_id, n.op, (split,), n.dtype, runs[:d + 1] + runs[d + 2:],
                         attrs_of(dim=d + 1, keepdim=False), n.src)
            next_id += 1
            out.append(first)
            n = replace(n, inputs=(first.id,), attrs=attrs_of(dim=d, keepdim=bool(n.attr("keepdim", False))))
        out.append(n)
    return program.replace_main(g.with_nodes([m for m in out if m.id not in dropped], g.output))


__all__ = ["split_reductions"]
