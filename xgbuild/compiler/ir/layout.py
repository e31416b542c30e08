"""Layouts of values over `NUM_GPU` ranks, and which layouts each op accepts (the SPMD rules).

A value is Replicated (every rank holds all of it), Sharded along one dim (rank r holds the r-th
of N equal slices) or a Partial sum (every rank holds a full-shaped addend; the value is their
sum). `rules(node, inputs, n)` lists the (input layouts -> output layout) combinations an op runs
with *locally*, each rank computing on its own pieces with no communication. The sharding pass
(passes/shard.py) inserts collectives so that every node's inputs match one of its rules; after
it, `infer_layouts` recomputes every value's layout from the graph alone (the collective ops
carry their target layouts), which is how the SPMD runtime and `inspect` read the plan back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .graph import BINARY, UNARY, Graph, Node, Op, tree_ids

_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "float16": 2, "bfloat16": 2, "int32": 4,
             "float32": 4, "int64": 8, "float64": 8}
SYMBOLIC_GUESS = 1024      # a symbolic dim's size when costing a choice (never for a reported number)


@dataclass(frozen=True)
class Layout:
    kind: str                  # "R" replicated, "S" sharded, "P" partial sum
    dim: int | None = None     # the split dim, for "S"

    def __str__(self) -> str:
        return {"R": "R", "P": "P(sum)"}.get(self.kind) or f"S({self.dim})"


R = Layout("R")
P = Layout("P")


def S(dim: int) -> Layout:
    return Layout("S", dim)


Rule = tuple[tuple[Layout, ...], Layout]

# The collective ops and what they produce: after the pass each is exactly one conversion.
CONVERSIONS = {Op.SHARD, Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL}
_LINEAR_UNARY = {Op.NEG}


def shardable(size, n: int | None) -> bool:
    """A dim can be split over n ranks: a multiple of n, or symbolic (checked when it is bound).
    n None: any dim (reading a plan back, where sizes bound at run time are checked separately)."""
    return n is None or isinstance(size, str) or (size % n == 0 and size >= n)


def nbytes(node: Node, guess: bool = False) -> int | None:
    dims = [d if isinstance(d, int) else (SYMBOLIC_GUESS if guess else None) for d in node.shape]
    if None in dims:
        return None
    return math.prod(dims) * _ITEMSIZE.get(node.dtype, 4)


def local_shape(shape: tuple, layout: Layout, n: int) -> tuple:
    """This rank's piece of a value of global `shape`."""
    if layout.kind != "S" or n == 1:
        return tuple(shape)
    out = list(shape)
    d = out[layout.dim]
    out[layout.dim] = d // n if isinstance(d, int) else f"{d}/{n}"
    return tuple(out)


def _aligned(out_rank: int, in_shape: tuple, out_shape: tuple, d: int) -> int | None:
    """The dim of a broadcast input that lines up with output dim d (None: broadcast along d)."""
    k = d - (out_rank - len(in_shape))
    if k < 0 or (in_shape[k] == 1 and out_shape[d] != 1):
        return None
    return k


def _elementwise(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    r = len(node.shape)
    rules: list[Rule] = [(tuple(R for _ in ins), R)]
    for d in range(r):
        if not shardable(node.shape[d], n):
            continue
        lay = tuple(R if (k := _aligned(r, i.shape, node.shape, d)) is None else S(k) for i in ins)
        rules.append((lay, S(d)))
    op = node.op
    if op in _LINEAR_UNARY:
        rules.append(((P,), P))
    elif op in (Op.ADD, Op.SUB):
        rules.append(((P, P), P))
    elif op is Op.MUL:
        rules += [((P, R), P), ((R, P), P)]
    elif op is Op.DIV and ins[1].dtype.startswith(("float", "bfloat")):
        rules.append(((P, R), P))
    return rules


def _matmul(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    a, b = ins
    rules: list[Rule] = [((R, R), R), ((P, R), P), ((R, P), P)]
    if len(a.shape) < 2 or len(b.shape) < 2:
        return rules
    r = len(node.shape)
    if shardable(a.shape[-2], n):
        rules.append(((S(len(a.shape) - 2), R), S(r - 2)))
    if shardable(b.shape[-1], n):
        rules.append(((R, S(len(b.shape) - 1)), S(r - 1)))
    if shardable(a.shape[-1], n):
        rules.append(((S(len(a.shape) - 1), S(len(b.shape) - 2)), P))
    for d in range(r - 2):      # batch dims
        if not shardable(node.shape[d], n):
            continue
        la = _aligned(r, a.shape[:-2] + (0, 0), node.shape, d)
        lb = _aligned(r, b.shape[:-2] + (0, 0), node.shape, d)
        rules.append(((R if la is None else S(la), R if lb is None else S(lb)), S(d)))
    return rules


def _reduce(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    x = ins[0]
    dim, keep = node.attr("dim"), node.attr("keepdim", False)
    rules: list[Rule] = [((R,), R)]
    if node.op in (Op.SUM, Op.MEAN):
        rules.append(((P,), P))
    rank = len(x.shape)
    if rank == 0:
        return rules
    d = None if dim is None else dim % rank
    for e in range(rank):
        if not shardable(x.shape[e], n):
            continue
        if d is None or e == d:
            if node.op is Op.SUM:          # MEAN is rewritten to SUM * 1/count by the pass first
                rules.append(((S(e),), P))
            continue
        rules.append(((S(e),), S(e if keep or e < d else e - 1)))
    return rules


def _reshape(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    x = ins[0]
    rules: list[Rule] = [((R,), R), ((P,), P)]
    for e in range(min(len(x.shape), len(node.shape))):
        # The split dim and all before it unchanged: each rank's piece reshapes on its own.
        if tuple(x.shape[:e + 1]) == tuple(node.shape[:e + 1]) and shardable(x.shape[e], n):
            rules.append(((S(e),), S(e)))
    return rules


def _index(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    """INDEX (and UNINDEX, its transpose) keep a split of an axis that the items take whole."""
    rest = tuple(R for _ in ins[1:])           # run-time indices: scalars, whole everywhere
    rules: list[Rule] = [((R, *rest), R), ((P, *rest), P)]      # linear in the indexed tensor
    items = node.attr("items")
    big = ins[0].shape if node.op is Op.INDEX else node.shape   # the indexed tensor's shape
    for e in range(len(big)):
        if e < len(items) and not _whole(items[e], big[e]):
            continue
        out = e - sum(1 for it in items[:e] if it[0] in ("i", "d"))     # axes dropped before it
        if not shardable(big[e], n):
            continue
        rules.append(((S(e), *rest), S(out)) if node.op is Op.INDEX else ((S(out), *rest), S(e)))
    return rules


def _gather(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    """GATHER reads whole rows of the table: a split of the indices, or of a table dim after the
    rows, carries over to the output; the indices are read whole wherever the table is split."""
    table, idx = ins
    lead = len(idx.shape)
    rules: list[Rule] = [((R, R), R), ((P, R), P)]            # linear in the table
    rules += [((R, S(e)), S(e)) for e in range(lead) if shardable(idx.shape[e], n)]
    rules += [((S(e), R), S(lead + e - 1)) for e in range(1, len(table.shape)) if shardable(table.shape[e], n)]
    return rules


def _scatter_add(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    """SCATTER_ADD is linear in its rows: rows split with their indices give each rank partial sums
    of the whole table; a split of the columns carries over."""
    _idx, src = ins
    rules: list[Rule] = [((R, R), R), ((R, P), P)]
    if shardable(src.shape[0], n):
        rules.append(((S(0), S(0)), P))
    if shardable(src.shape[1], n):
        rules.append(((R, S(1)), S(1)))
    return rules


def _whole(item, size) -> bool:
    if item[0] != "s":
        return False
    _, lo, hi, step = item
    return lo in (None, 0) and step in (None, 1) and (hi is None or (isinstance(size, int) and hi >= size))


def rules(node: Node, ins: list[Node], n: int | None) -> list[Rule]:
    """The local (communication-free) ways `node` runs, given its input nodes; [] for sources."""
    op = node.op
    if not ins:
        return []
    if op in UNARY or op in BINARY or op is Op.WHERE:
        return _elementwise(node, ins, n)
    if op is Op.MATMUL:
        return _matmul(node, ins, n)
    if op in (Op.SUM, Op.MEAN, Op.MAX, Op.MIN):
        return _reduce(node, ins, n)
    if op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
        dim = node.attr("dim") % max(len(node.shape), 1)
        return [((R,), R)] + [((S(e),), S(e)) for e in range(len(node.shape))
                              if e != dim and shardable(node.shape[e], n)]
    if op is Op.TRANSPOSE:
        d0, d1 = (node.attr("dim0") % len(node.shape), node.attr("dim1") % len(node.shape))
        swap = {d0: d1, d1: d0}
        return [((R,), R), ((P,), P)] + [((S(e),), S(swap.get(e, e))) for e in range(len(node.shape))
                                         if shardable(ins[0].shape[e], n)]
    if op is Op.RESHAPE:
        return _reshape(node, ins, n)
    if op in (Op.INDEX, Op.UNINDEX):
        return _index(node, ins, n)
    if op is Op.GATHER:
        return _gather(node, ins, n)
    if op is Op.SCATTER_ADD:
        return _scatter_add(node, ins, n)
    if op in (Op.ATTN_LSE, Op.ATTN_GRAD):
        # Attention's backward: every tensor operand split alike along one batch dim (the scale whole).
        batch = len(ins[0].shape) - 2
        return [(tuple(R for _ in ins), R)] + [
            (tuple(S(e) if tuple(i.shape) else R for i in ins), S(e)) for e in range(batch)
            if shardable(ins[0].shape[e], n)]
    if op in (Op.STAGE, Op.MICROBATCH):     # markers: any layout passes through
        return [((R,), R), ((P,), P)] + [((S(e),), S(e)) for e in range(len(node.shape))]
    return [(tuple(R for _ in ins), R)]      # RANDN, RAND: on whole values (the same on every rank)


def produced(node: Node, in_layouts: tuple[Layout, ...]) -> Layout | None:
    """What a collective op yields (None if `node` is not one)."""
    op = node.op
    if op is Op.SHARD or op is Op.REDUCE_SCATTER or op is Op.ALL_TO_ALL:
        return S(node.attr("dim"))
    if op is Op.ALL_GATHER or op is Op.ALL_REDUCE:
        return R
    return None


def infer_layouts(graph: Graph, n: int) -> dict[int, Layout]:
    """Every value's layout in a graph the sharding pass produced (raises on one it did not)."""
    out: dict[int, Layout] = {}
    by_id = graph.by_id
    for node in graph.nodes:
        lays = tuple(out[i] for i in node.inputs)
        got = produced(node, lays)
        if got is None:
            rs = rules(node, [by_id[i] for i in node.inputs], None)
            got = R if not rs else next((o for ins, o in rs if ins == lays), None)
            if got is None:
                raise ValueError(f"node %{node.id} ({node.op.value}) has inputs laid out "
                                 f"{', '.join(map(str, lays))}, which it cannot run on locally")
        out[node.id] = got
    return out


def collective_bytes(node: Node, n: int, guess: bool = False) -> int | None:
    """Bytes each rank sends for a collective (ring algorithms); 0 for a local slice. `guess`:
    symbolic sizes taken as SYMBOLIC_GUESS (else the bytes are unknown, None)."""
    size = nbytes(node, guess)
    if size is None:
        return None
    if node.op is Op.SHARD or n == 1:
        return 0
    share = size * (n - 1) // n
    if node.op is Op.ALL_REDUCE:
        return 2 * share
    if node.op is Op.ALL_TO_ALL:
        return share // n
    return share            # all-gather, reduce-scatter


def output_layouts(graph: Graph, layouts: dict[int, Layout]) -> list[Layout]:
    return [layouts[i] for i in tree_ids(graph.output)]


def split_inputs(graph: Graph) -> dict[str, int]:
    """Inputs that every use splits along one dim: a rank loads only its slice of them."""
    users = graph.users()
    outputs = set(tree_ids(graph.output))
    out = {}
    for name, nid in graph.inputs:
        dims = {graph.node(u).attr("dim") if graph.node(u).op is Op.SHARD else None for u in users[nid]}
        if len(dims) == 1 and None not in dims and nid not in outputs:
            out[name] = dims.pop()
    return out
