"""Reshapes sink below element-wise ops, so that an element-wise chain runs in the shape of the value
it starts from, and a matmul's consumers can become its epilogue.

Imported models compute a linear layer as `reshape(x, [B*T, D]) @ W + b`, reshaped back to
`[B, T, N]` before the activation and the residual add (transformers' `Conv1D`, `nn.Linear` on 3-D
inputs). The reshape between the product and its consumers kept them out of the matmul kernel:
GPT-2's GELU ran as two element-wise kernels and each residual add as one, each reading and writing
a whole activation. With the reshape moved below them, they read the product in its own shape.

Rewrite, in program order: an element-wise node `n` of shape S whose tensor inputs are each
  - a reshape of a value of shape T (or a node already rewritten to shape T: one T for all), or
  - a scalar, or
  - a value of shape S that is dense (made by a kernel, an input, a constant, or reshapes of one:
    its reshape to T is a view, never a copy), or
  - a value that broadcasts against S and is 1 across every group of dims the reshape merges or
    splits (a BatchNorm's [1, C, 1, 1] against a convolution's product [N, C, H*W] reshaped to
    [N, C, H, W]): it is reshaped to broadcast against T the same way ([1, C, 1]),
with at least one of the first kind, and no input of shape S that a product makes in S (a matmul
of shape S, or element-wise ops of S over one: those are its epilogue where they are), becomes
`n' = op(...)` of shape T followed by
`n = reshape(n', S)`; reshapes of the dense values to T are added. A reshape of a reshape reads the
first reshape's input (the same row-major order), and one back to that input's shape is that input.
Every value keeps its dtype and its per-op rounding; only where a reshape sits changes.

Needs: a verified graph in program order. Leaves: the same values at every original node id that
is still read (the moved nodes' old ids name the reshapes back); no reshape that nothing reads.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..ir.graph import BINARY, COLLECTIVE, UNARY, Node, Op, Program, attrs_of, tree_ids, tree_map

ELEMENTWISE = UNARY | BINARY | {Op.WHERE}          # (the scheduler's element-wise ops that read tensors)
VIEWS = {Op.RESHAPE, Op.TRANSPOSE, Op.INDEX, *COLLECTIVE}


def sink_reshapes(program: Program) -> Program:
    g = program.main
    by_id = {n.id: n for n in g.nodes}
    next_id = max(by_id, default=-1) + 1
    alias: dict[int, int] = {}
    out: list[Node] = []
    # node id -> (id of the same values in another shape, that shape): `id` is reshape(of, shape(id))
    reshaped: dict[int, tuple[int, tuple]] = {}
    # Values a product makes in their own shape: a matmul, and element-wise nodes (not moved) over
    # one of their shape. A node reading one stays in that shape: moved, it would leave the
    # product's epilogue (a training program's residual add, [N, D] beside an embedding's
    # [B, T, D], went to [B, T, D] and out of both its matmuls).
    made: set[int] = set()

    def node(i: int) -> Node:
        return by_id[i]

    def dense(i: int) -> bool:
        n = node(i)
        while n.op is Op.RESHAPE:
            n = node(n.inputs[0])
        return n.op not in VIEWS

    def add(n: Node) -> None:
        by_id[n.id] = n
        out.append(n)

    for n in g.nodes:
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        if n.op is Op.RESHAPE:
            src = node(n.inputs[0])
            if src.id in reshaped:                      # reshape of a reshape: read the first one's input
                base = reshaped[src.id][0]
                if tuple(node(base).shape) == tuple(n.shape):
                    alias[n.id] = base
                    continue
                n = replace(n, inputs=(base,))
            add(n)
            reshaped[n.id] = (n.inputs[0], tuple(node(n.inputs[0]).shape))
            continue
        if n.op is Op.UNINDEX and (below := _unindex_below(n, reshaped, node, dense)) is not None:
            items, shape, base = below
            moved = replace(n, id=next_id, inputs=(base,), shape=shape, attrs=attrs_of(items=items))
            next_id += 1
            add(moved)
            add(Node(n.id, Op.RESHAPE, (moved.id,), n.dtype, n.shape, (), n.src))
            reshaped[n.id] = (moved.id, shape)
            continue
        target = _target(n, reshaped, node)
        own = [i for i in n.inputs if tuple(node(i).shape) == tuple(n.shape)]
        if target is None or any(i in made for i in own) or \
                not all(_keeps(i, target, reshaped, node) or dense(i) for i in own):
            add(n)
            if n.op is Op.MATMUL or (n.op in ELEMENTWISE and any(i in made for i in own)):
                made.add(n.id)
            continue
        inputs = []
        for i in n.inputs:
            if i in reshaped and reshaped[i][1] == target:
                inputs.append(reshaped[i][0])
            elif tuple(node(i).shape) == ():
                inputs.append(i)
            else:                                       # a dense value of n's shape, or a broadcast
                shape = target if tuple(node(i).shape) == tuple(n.shape) else \
                    _broadcast_in(tuple(node(i).shape), tuple(n.shape), target)
                view = Node(next_id, Op.RESHAPE, (i,), node(i).dtype, shape, (), n.src)
                next_id += 1
                add(view)
                inputs.append(view.id)
        moved = replace(n, id=next_id, inputs=tuple(inputs), shape=target)
        next_id += 1
        add(moved)
        add(Node(n.id, Op.RESHAPE, (moved.id,), n.dtype, n.shape, (), n.src))
        reshaped[n.id] = (moved.id, target)
    output = tree_map(g.output, lambda i: alias.get(i, i))
    # The reshapes nothing reads any more (the chain's, now between its moved ops) go here, so
    # that the pass never grows the graph by more than the views it adds for dense operands.
    # Every node but those reshapes stays (dce runs later), so what any of them reads is live.
    live = set(tree_ids(output))
    for n in reversed(out):
        if n.id in live or n.op is not Op.RESHAPE:
            live.update(n.inputs)
    out = [n for n in out if n.id in live or n.op is not Op.RESHAPE]
    return program.replace_main(g.with_nodes(out, output))


WHOLE = ("s", None, None, None)


def _unindex_below(n: Node, reshaped: dict, node, dense) -> tuple[tuple, tuple, int] | None:
    """(items, shape, input) of the unindex that `n` becomes below its input's reshape, or None.

    `n` places a [N, D] value, a reshape of a strided view y (attention's head gradients:
    transpose(dq), [B, T, H, DH], merged to [N, D], a copy), in columns [a, a + D) of [N, C]
    (their share of the fused qkv projection's gradient), a and C multiples of D. Run as y placed
    at index a / D of a [*y's rows, C / D, *y's columns] value, which is [N, C] row-major, it reads
    y through its strides and no copy is made; the reshape back to [N, C] is a view."""
    if len(n.inputs) != 1 or len(n.shape) != 2 or n.inputs[0] not in reshaped:
        return None
    base, shape = reshaped[n.inputs[0]]
    rows, cols = node(n.inputs[0]).shape
    N, C = n.shape
    if dense(base) or not all(isinstance(d, int) for d in (*shape, rows, cols, N, C)):
        return None                                     # the reshape is a view already, or sizes unknown
    first, second = n.attr("items")
    if first != WHOLE or second[0] != "s" or second[3] not in (None, 1):
        return None
    lo = second[1] or 0
    hi = C if second[2] is None else second[2]
    if lo < 0 or hi - lo != cols or lo % cols or C % cols or rows != N:
        return None
    split = next((k for k in range(1, len(shape)) if math.prod(shape[:k]) == N and math.prod(shape[k:]) == cols), None)
    if split is None:
        return None
    items = (WHOLE,) * split + (("i", lo // cols),) + (WHOLE,) * (len(shape) - split)
    return items, shape[:split] + (C // cols,) + shape[split:], base


def _keeps(i: int, target: tuple, reshaped: dict, node) -> bool:
    """Input `i` needs no new reshape to join a node moved to `target`: a scalar, or the values
    of a node already in that shape."""
    return tuple(node(i).shape) == () or (i in reshaped and reshaped[i][1] == target)


def _target(n: Node, reshaped: dict, node) -> tuple | None:
    """The shape `n` may run in instead of its own, or None when it stays as it is."""
    if n.op not in ELEMENTWISE or not n.inputs:
        return None
    shape = tuple(n.shape)
    target = None
    broadcast = []
    for i in n.inputs:
        s = tuple(node(i).shape)
        if i in reshaped and s == shape and reshaped[i][1] != shape:
            if target is None:
                target = reshaped[i][1]
            elif reshaped[i][1] != target:
                return None
        elif s not in ((), shape):
            broadcast.append(s)
    if target is not None and any(_broadcast_in(s, shape, target) is None for s in broadcast):
        return None                                     # a broadcast operand with no shape there
    return target


def _groups(shape: tuple, target: tuple) -> list[tuple[list[int], list[int]]] | None:
    """The dims of `shape` and of `target` (one number of elements) that a row-major reshape maps
    onto each other, group by group (size-1 dims in groups of their own where they can be)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(shape) or j < len(target):
        if i < len(shape) and shape[i] == 1 and (j >= len(target) or target[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(target) and target[j] == 1 and (i >= len(shape) or shape[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(shape) or j >= len(target):
            return None
        a, b = [i], [j]
        pa, pb = shape[i], target[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(shape):
                pa *= shape[i]
                a.append(i)
                i += 1
            elif pb < pa and j < len(target):
                pb *= target[j]
                b.append(j)
                j += 1
            else:
                return None
        groups.append((a, b))
    return groups


def _broadcast_in(s: tuple, shape: tuple, target: tuple) -> tuple | None:
    """The shape in which an operand of shape `s`, broadcast against `shape`, broadcasts the same
    way against `target` (`shape` reshaped), or None: it must be 1 across each group of dims the
    reshape merges or splits, or match a group kept whole (a BatchNorm's [1, C, 1, 1] against a
    product [N, C, H*W] reshaped to [N, C, H, W] is [1, C, 1])."""
    if not all(isinstance(d, int) for d in (*s, *shape, *target)):
        return None                                     # symbolic sizes: no groups to match
    groups = _groups(shape, target)
    if groups is None or len(s) > len(shape):
        return None
    s = (1,) * (len(shape) - len(s)) + s
    out = [1] * len(target)
    for a, b in groups:
        if all(s[d] == 1 for d in a):
            continue
        if len(a) == 1 and len(b) == 1:
            out[b[0]] = s[a[0]]
            continue
        return None
    return tuple(out)
