"""Rematerialisation in a differentiated function: element-wise values the backward pass reads are
computed again there, from values it holds anyway, instead of being kept from the forward pass.

A training step's backward pass reads, for each layer, the forward pass's intermediates: a tanh
GELU's four products and sums, a LayerNorm's centred rows, a bfloat16 copy of the attention
probabilities beside the float32 ones. Kept, each lives from its layer's forward to its layer's
backward: most of the step's peak memory. Every one of them is a few element-wise ops away from a
value the backward pass reads anyway (a matmul's output, the probabilities, a reduction's row
statistics) or that costs little to keep; recomputed next to its backward reader, the scheduler
fuses it into that reader's kernel.

`remat_backward` is called by `autodiff.differentiate` on the function's node list (the forward
nodes, then the adjoint nodes), where which reads are the backward pass's is known. For a forward
node F that is element-wise (unary, binary, `where`, a cast; views cost nothing) and read by the
backward pass: its recomputation closure walks F's element-wise inputs back until each leaf is
free (an input, a weight, an IOTA, a constant), read by the backward pass at or after F's first
backward reader anyway, or small (at most 1/16 of F); a leaf that is none of these (a matmul's
output, a reduction) is held longer, and F is recomputed only when those leaves' bytes are no more
than F's (a symbolic dim counts as 64, so sizes over the same symbols compare). A clone that a
product, a flash kernel or a view reads is written to memory by a kernel of its own: it is made
only where it frees at least the bytes that kernel moves (every value it reads, a weight in full,
and the value written). So a layer's bfloat16 weight and normalised rows, read by the weight
gradient's product, are kept rather than cast again (GPT-2 small's step: 94 fewer launches, 0.7 GB
more held of 4.7). The clones (marked `remat`, so CSE keeps them apart from the
forward nodes) go right before F's first backward reader, and every backward reader of F reads
the clone. The mark numbers the insertion point, so CSE keeps the clones made for different
backward readers apart and each fuses into its own reader's kernel (a tanh GELU's terms into the
gradient product's epilogue, apart from its bfloat16 output for the weight gradient's product:
shared, the two were one kernel that wrote six float32 terms per layer); clones that a product,
a flash kernel or a view reads are written to memory anyway and share one mark (1). Values are bit-identical: the same ops on the same float32 (or exact) values; a
bfloat16 or float16 element-wise value other than a cast is never recomputed, nor anything that
reads one (a kernel computes it in float32 and rounds it only where it stores it, so a fused
forward reader can see it unrounded).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Node, Op
from ..ops import Kind, op_def

CHEAP = (Kind.UNARY, Kind.BINARY, Kind.SELECT)
FREE = (Op.INPUT, Op.PARAM, Op.IOTA, Op.FULL, Op.CONST)
MAX_DEPTH = 16          # element-wise ops a closure walks back through
SMALL = 16              # a leaf at most 1/SMALL of the value it serves is kept for free
# A clone may read at most READS times F's bytes (every value it reads from outside, held anyway
# or not). Unbounded, GPT-2 small's residual stream x_l = x_0 + the branches' outputs was summed
# again from all l of them before each LayerNorm's gradient: O(L^2) reads, 24 row kernels reading
# up to 17 tensors (0.7 ms of a 21 ms step on an H200) to save 25 MB each.
READS = 2


SYMBOLIC = 64           # what a symbolic dim counts as: sizes compare values over the same symbols


def _size(n: Node) -> int:
    count = 1
    for d in n.shape:
        count *= d if isinstance(d, int) else SYMBOLIC
    return count * _itemsize(n.dtype)


def _itemsize(dtype: str) -> int:
    from ...dtypes import ITEMSIZE
    return ITEMSIZE.get(dtype, 8)


def _cheap(n: Node) -> bool:
    kind = op_def(n.op).kind
    if kind is Kind.VIEW:
        return n.op in (Op.RESHAPE, Op.TRANSPOSE) or (n.op is Op.INDEX and len(n.inputs) == 1)
    if kind not in CHEAP:
        return False
    return n.op is Op.CAST or n.dtype not in ("bfloat16", "float16")


def _unrounded(m: Node, by_id: dict[int, Node]) -> bool:
    """Whether a 16-bit value made by an element-wise op (through views) is read: the forward
    kernel may hold it unrounded in float32 registers where a clone would read it rounded."""
    while op_def(m.op).kind is Kind.VIEW and m.inputs and m.inputs[0] in by_id:
        m = by_id[m.inputs[0]]
    return m.dtype in ("bfloat16", "float16") and op_def(m.op).kind in CHEAP


def _moved(acc: list[int], by_id: dict[int, Node]) -> int:
    """Bytes a materialised clone's kernel moves: every value its closure reads from outside (a
    weight read again in full, a held leaf) and the value written."""
    inside = set(acc)
    read: dict[int, int] = {}
    for nid in acc:
        n = by_id[nid]
        for i in n.inputs:
            if i not in inside:     # through a view (a layer's slice of a stacked weight): its part
                read[i] = max(read.get(i, 0), _size(n) if op_def(n.op).kind is Kind.VIEW else _size(by_id[i]))
    return sum(read.values()) + _size(by_id[acc[-1]])


def remat_backward(nodes: list[Node], forward: set[int], keep: set[int], next_id: int) -> list[Node]:
    """`nodes` (forward nodes first, in `forward`, then the backward pass's) with the backward
    pass's reads of element-wise forward values recomputed where that holds less memory (see the
    module's doc). `keep`: values the function returns (never moved). New nodes get ids from
    `next_id` on."""
    by_id = {n.id: n for n in nodes}
    pos = {n.id: i for i, n in enumerate(nodes)}
    users: dict[int, list[int]] = {n.id: [] for n in nodes}
    for n in nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n.id)
    # The last position each value is read at (the backward readers' positions are what matter).
    last = {nid: max((pos[u] for u in us), default=pos.get(nid, 0)) for nid, us in users.items()}
    plans: list[tuple[int, list[int], bool]] = []   # (first backward reader's position, closure, operand)

    def closure(nid: int, at: int, depth: int, acc: list[int], seen: set[int], leaves: set[int],
                reads: set[int]) -> bool:
        if nid in seen:
            return True
        n = by_id[nid]
        if depth > MAX_DEPTH or not _cheap(n):
            return False
        for i in n.inputs:
            m = by_id.get(i)
            if m is None or _unrounded(m, by_id):
                return False
            if m.op not in FREE and not (_cheap(m) and m.id in forward and last.get(i, -1) < at):
                reads.add(i)
            if m.op in FREE or last.get(i, -1) >= at:
                continue
            if _size(m) * SMALL <= _size(n):
                leaves.add(i)
                continue
            if _cheap(m) and m.id in forward and closure(i, at, depth + 1, acc, seen, leaves, reads):
                continue
            reads.add(i)
            leaves.add(i)
        seen.add(nid)
        acc.append(nid)
        return True

    for f in nodes:
        if f.id not in forward or f.id in keep or not _cheap(f) or op_def(f.op).kind is Kind.VIEW:
            continue
        late = [u for u in users.get(f.id, ()) if u not in forward]
        if not late:
            continue
        size_f = _size(f)
        at = min(pos[u] for u in late)
        acc: list[int] = []
        leaves: set[int] = set()
        reads: set[int] = set()
        if not closure(f.id, at, 0, acc, set(), leaves, reads):
            continue
        cost = sum(_size(by_id[leaf]) for leaf in leaves if last[leaf] < at)
        if cost > size_f:
            continue
        if sum(_size(by_id[i]) for i in reads) > READS * size_f:
            continue        # reads far more than keeping F would (a residual stream summed again)
        for leaf in leaves:
            last[leaf] = max(last[leaf], at)        # the clone reads it there; later readers read the clone
        early = [pos[u] for u in users[f.id] if u in forward]
        last[f.id] = max(early, default=pos[f.id])
        # Read by a product (through a view, or as its operand): the clone is materialised for
        # it, so clones of this value at other insertion points may share it (CSE).
        operand = any(op_def(by_id[u].op).kind in (Kind.VIEW, Kind.CONTRACT, Kind.ATTENTION) for u in late)
        if operand and size_f < _moved(acc, by_id):
            continue        # a kernel of its own that moves more bytes than it frees
        plans.append((at, acc, operand))

    if not plans:
        return nodes
    # Clones before each first backward reader; one clone per (node, insertion point).
    before: dict[int, list[tuple[list[int], bool]]] = {}
    for at, acc, operand in plans:
        before.setdefault(at, []).append((acc, operand))
    out: list[Node] = []
    clone_at: dict[tuple[int, int], int] = {}
    current: dict[int, int] = {}            # F -> its clone, for the backward readers
    point = {at: k + 1 for k, at in enumerate(sorted(before))}     # insertion points, numbered
    for i, n in enumerate(nodes):
        for acc, operand in before.get(i, ()):
            for nid in acc:
                if (nid, i) in clone_at:
                    continue
                src = by_id[nid]
                ins = tuple(clone_at.get((x, i), x) for x in src.inputs)
                # `remat` numbers the insertion point: CSE keeps clones for different backward
                # readers apart, so each fuses with its own reader's kernel (a GELU's terms with the
                # gradient product's epilogue, apart from its bfloat16 output for the weight
                # gradient). Clones for products' operands, or read through a view, written to
                # memory anyway, share (1).
                viewed = any(op_def(by_id[u].op).kind is Kind.VIEW for u in users.get(nid, ()) if u in acc)
                mark = 1 if operand or viewed else point[i]
                new = replace(src, id=next_id, inputs=ins, attrs=tuple(sorted(src.attrs + (("remat", mark),))))
                next_id += 1
                clone_at[(nid, i)] = new.id
                out.append(new)
            f = acc[-1]
            current[f] = clone_at[(f, i)]
        if n.id not in forward and any(x in current for x in n.inputs):
            n = replace(n, inputs=tuple(current.get(x, x) for x in n.inputs))
        out.append(n)
    return out
