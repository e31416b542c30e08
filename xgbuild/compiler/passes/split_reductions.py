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

Needs: a verified graph in program order, shapes static where it splits. Leaves: the same value
at the reduction's node id.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Node, Op, Program, attrs_of

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


def _dense(x: Node, by_id: dict[int, Node]) -> bool:
    """A value a kernel made (or an input), or reshapes of one: any reshape of it is a view."""
    while x.op is Op.RESHAPE:
        x = by_id[x.inputs[0]]
    return x.op not in VIEWS


def _column_split(n: Node, x: Node, by_id: dict[int, Node]) -> int | None:
    """The dim (normalised) of a reduction along a strided dim worth two stages, else None."""
    dim = n.attr("dim")
    if n.op not in SPLIT or dim is None or x.dtype not in DTYPES or n.dtype != x.dtype or not _dense(x, by_id):
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
    next_id = max((n.id for n in g.nodes), default=-1) + 1
    out: list[Node] = []
    for n in g.nodes:
        if n.inputs and _splits(n, by_id[n.inputs[0]]):
            x = by_id[n.inputs[0]]
            keep = bool(n.attr("keepdim", False))
            shape = tuple(x.shape)[:-1] + ((1,) if keep else ())
            rows = Node(next_id, n.op, (x.id,), n.dtype, shape, attrs_of(dim=len(x.shape) - 1, keepdim=keep), n.src)
            next_id += 1
            out.append(rows)
            n = replace(n, inputs=(rows.id,))
        elif n.inputs and (d := _column_split(n, by_id[n.inputs[0]], by_id)) is not None:
            x = by_id[n.inputs[0]]
            shape = tuple(x.shape)
            runs = shape[:d] + (shape[d] // COLUMN_CHUNK, COLUMN_CHUNK) + shape[d + 1:]
            view = Node(next_id, Op.RESHAPE, (x.id,), x.dtype, runs, (), n.src)
            first = Node(next_id + 1, n.op, (view.id,), n.dtype, runs[:d + 1] + runs[d + 2:],
                         attrs_of(dim=d + 1, keepdim=False), n.src)
            next_id += 2
            out += [view, first]
            n = replace(n, inputs=(first.id,), attrs=attrs_of(dim=d, keepdim=bool(n.attr("keepdim", False))))
        out.append(n)
    return program.replace_main(g.with_nodes(out, g.output))


__all__ = ["split_reductions"]
