"""Attention's values written through views of the tensors their readers want, instead of copied
between kernels (the schedule's decisions, `schedule.py`; the kernels' strides, their templates):

- `merged_heads`: the forward's output written as its merged-heads view ([B, T, H * D]), which
  PyTorch copies between kernels;
- `placed_grads`: a fused qkv projection's gradient, the three heads' gradients placed into the
  slots of one [B, T, 3, H, DH] tensor, written by dk and dv's kernel (`slots_of` reads the
  placement back from that kernel's nodes for its template).

Stride arithmetic alone (`ir.strides`): the deploy runtime imports the schedule without torch.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Op
from ..ir.strides import contiguous_strides, slot_strides, static_slot, transposed_axes, view_strides


def merged_heads(graph: Graph, users: dict, anchor: int, outputs: set[int]) -> list[int]:
    """The views after an attention's output `anchor` that the kernel writes through instead: the
    chain of single-reader reshapes and transposes up to the first reshape that is no view of a
    contiguous output (heads merged, `o.transpose(1, 2).reshape(B, T, H * D)`: PyTorch copied it
    between kernels), when the output's buffer seen back through the chain, reshape by reshape, is
    a strided view in the output's shape with a contiguous last dim (the kernel stores through
    those strides, templates/attention.py). Static shapes only; [] when there is no such chain.
    (Stride arithmetic alone, `ir.strides`: the deploy runtime imports this module without torch.)"""
    chain, x = [], graph.node(anchor)
    if not all(isinstance(d, int) for d in x.shape):
        return []
    view = (tuple(x.shape), contiguous_strides(x.shape))
    while x.id not in outputs and len(users[x.id]) == 1:
        u = graph.node(users[x.id][0])
        if u.op not in (Op.RESHAPE, Op.TRANSPOSE) or not all(isinstance(d, int) for d in u.shape):
            return []
        chain.append(u.id)
        view = _view_step(view, u, tuple(u.shape))
        if view is None:
            break                   # a copy: this reshape is the one the kernel writes
        x = u
    else:
        return []
    last = tuple(graph.node(chain[-1]).shape)
    view = (last, contiguous_strides(last))
    for nid in reversed(chain):
        u = graph.node(nid)
        view = _view_step(view, u, tuple(graph.node(u.inputs[0]).shape))
        if view is None:
            return []
    # (the kernel stores the head dim as a contiguous run: vectorised, as its own layout's)
    shape, strides = view
    return chain if not strides or strides[-1] == 1 or shape[-1] == 1 else []


def _view_step(view: tuple[tuple, tuple], u: Node, shape: tuple) -> tuple[tuple, tuple] | None:
    """(shape, strides) of a strided view seen through view node `u`, a transpose (its own inverse)
    or a reshape to `shape`; None where that reshape is no view (a copy)."""
    if u.op is Op.TRANSPOSE:
        return tuple(_swapped(v, u) for v in view)
    strides = view_strides(*view, shape)
    return None if strides is None else (shape, strides)


def _swapped(values: tuple, transpose: Node) -> tuple:
    out = list(values)
    a, b = transpose.attr("dim0"), transpose.attr("dim1")
    out[a], out[b] = out[b], out[a]
    return tuple(out)


def _slot(n: Node) -> tuple[int, int] | None:
    """(dim, index) of an `unindex` placing its input at one static index of one dim (`static_slot`)."""
    return static_slot(n.attr("items")) if n.op is Op.UNINDEX and len(n.inputs) == 1 else None


def _axes(chain: list[Node], rank: int) -> tuple[int, ...]:
    """Which dim of a value each dim of it seen through a chain of transposes is."""
    return transposed_axes([(t.attr("dim0"), t.attr("dim1")) for t in chain], rank)


def placed_grads(graph: Graph, users: dict, grads: dict[str, int], outputs: set[int],
                 position: dict[int, int]) -> tuple[list[int], int] | None:
    """Attention's three gradients (`grads`: "q", "k", "v" -> their `attn_grad` nodes) placed into
    one tensor P, as a fused qkv projection's gradient makes them: each read only by one chain of
    transposes into an `unindex` at slot i of one dim of P, the three slots covering that dim, the
    unindexes summed by adds alone into P. Then the dk/dv kernel writes P: dk and dv through the
    slots' strides, and dq (made by the kernel before it) copied in, block by block, where an
    element-wise kernel had read the three and written P. Returns (the placing nodes in program
    order, P), or None: another reader of any of them, a reshape on the way, other slots, several
    dims, or queries and keys of different lengths (the kernel's key blocks copy dq's rows)."""
    if set(grads) != {"q", "k", "v"}:
        return None
    q = graph.node(grads["q"])
    if any(not isinstance(s, int) for s in q.shape) or q.shape[-2] != graph.node(q.inputs[1]).shape[-1] \
            or any(tuple(graph.node(g).shape) != tuple(q.shape) for g in grads.values()):
        return None
    chains, slots = [], {}
    for g in grads.values():
        nid, chain = g, []
        while True:
            if nid in outputs or len(users[nid]) != 1:
                return None
            u = graph.node(users[nid][0])
            chain.append(u.id)
            if u.op is not Op.TRANSPOSE:
                break
            nid = u.id
        place = _slot(graph.node(chain[-1]))
        if place is None:
            return None
        slots[chain[-1]] = place
        chains.append([graph.node(t) for t in chain[:-1]])
    axes = {_axes(c, len(q.shape)) for c in chains}
    if len({d for d, _ in slots.values()}) != 1 or len(axes) != 1:
        return None
    dim = next(iter(slots.values()))[0]
    shape = tuple(graph.node(next(iter(slots))).shape)
    if sorted(i for _, i in slots.values()) != list(range(shape[dim])) \
            or slot_strides(contiguous_strides(shape), dim, axes.pop())[-1] != 1:
        return None         # (the kernel stores the head dim as a contiguous run)
    # The adds: each reads two of what is placed so far and is the only reader of both.
    tree, adds, grew = set(slots), [], True
    while grew:
        grew = False
        for a in {users[x][0] for x in tree if len(users[x]) == 1} - tree:
            add = graph.node(a)
            if add.op is Op.ADD and tuple(add.shape) == shape and all(i in tree for i in add.inputs):
                tree.add(a)
                adds.append(a)
                grew = True
    roots = [x for x in tree if not any(u in tree for u in users[x])]
    if len(adds) != len(slots) - 1 or len(roots) != 1 or roots[0] not in adds \
            or any(x != roots[0] and (len(users[x]) != 1 or x in outputs) for x in tree):
        return None
    nodes = [t.id for c in chains for t in c] + list(slots) + adds
    return sorted(nodes, key=position.__getitem__), roots[0]


def slots_of(graph: Graph, nodes: list[int]) -> tuple[int, int, int, tuple[int, ...], tuple[int, int, int]] | None:
    """The placement a dk/dv kernel of `nodes` writes (`placed_grads`), when it has one: (the slots
    tensor's node, dq's node, the slots' dim, the gradients' dims as the slots' (`transposed_axes`),
    the slot of dq, dk and dv)."""
    inside = set(nodes)
    unindexes = [graph.node(m) for m in nodes if graph.node(m).op is Op.UNINDEX]
    if not unindexes:
        return None
    slots, gq, dim, axes = {}, None, 0, ()
    for u in unindexes:
        chain, x = [], graph.node(u.inputs[0])
        while x.op is Op.TRANSPOSE:
            chain.insert(0, x)
            x = graph.node(x.inputs[0])
        dim, index = _slot(u)
        axes = _axes(chain, len(x.shape))
        slots[x.attr("wrt")] = index
        if x.id not in inside:
            gq = x.id
    placed = {m for m in nodes if graph.node(m).op in (Op.UNINDEX, Op.ADD)}
    top = next(m for m in placed if not any(m in graph.node(o).inputs for o in placed))
    return top, gq, dim, axes, (slots["q"], slots["k"], slots["v"])
