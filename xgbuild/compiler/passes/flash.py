"""Attention differentiated flash-style: the backward pass recomputes the scores, never stores them.

Differentiated op by op, `softmax(scores) @ v` keeps its [T, S] probabilities for the backward
pass (dv = p^T @ dO, and the softmax's own rule reads p), writes the scores' gradient (another
[T, S]) and reads both back: in a GPT-2-small training step (8 x 12 heads of 1024 x 1024 per
layer) that was 4.8 GB of float32 probabilities alive at once and about 18 ms of the step's
roofline floor, against about 1.5 ms of products.

`find_attention` recognises, in a function being differentiated,

    o = cast?(softmax(where?(causal, cast?(q @ kT) * scale?, fill), dim=-1)) @ v

where every value between `q @ kT` and `o` has no other reader, the scores are float32 or
float64, `causal` compares integer IOTAs as `col <= row` (the scheduler's causal mask), `fill`
is a constant, `scale` a scalar and q, kT and v have the same batch dims. `attention_vjp` is its
gradient: `attn_lse` recomputes each query row's log-sum-exp, delta = sum(dO * o) over each row,
and one `attn_grad` per operand (ops/attention.py). The forward pass keeps only q, kT, v and o,
and with the probabilities read by nothing else its `softmax(...) @ v` is one fused attention
kernel (codegen/schedule.py), which never writes them either.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph, Op, attrs_of, tree_ids
from ..ir.shapes import index_axis

SCORE_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Attention:
    out: int              # o = p @ v
    q: int
    kt: int
    v: int
    scale: int | None     # a scalar node, or None (1)
    causal: bool
    fill: float | None    # the causal where's constant
    dtype: str            # the scores' (and softmax's) dtype


def _single_user(users: dict, nid: int, outputs: set[int]) -> bool:
    return len(users.get(nid, ())) == 1 and nid not in outputs


def _index_axis(g: Graph, nid: int) -> str | None:
    """"row" or "col": which score dim an integer IOTA (or a reshape of one to [T, 1] / [1, S])
    runs along (the scheduler's `index_axis`); None otherwise."""
    n = g.node(nid)
    iota = g.node(n.inputs[0]) if n.op is Op.RESHAPE else n
    if iota.op is not Op.IOTA or not iota.dtype.startswith(("int", "uint")):
        return None
    return index_axis(n, 2)


def _causal_mask(g: Graph, nid: int) -> bool:
    """Is node `nid` `col <= row` (or `row >= col`) of integer IOTAs along the score dims?"""
    n = g.node(nid)
    if n.op not in (Op.LE, Op.GE) or len(n.inputs) != 2:
        return False
    axes = tuple(_index_axis(g, i) for i in n.inputs)
    return axes == (("col", "row") if n.op is Op.LE else ("row", "col"))


def find_attention(g: Graph) -> dict[int, Attention]:
    """Every differentiable attention in `g` (module doc), by the node id of its output."""
    users = g.users()
    outputs = set(tree_ids(g.output))
    found: dict[int, Attention] = {}
    for o in g.nodes:
        if o.op is not Op.MATMUL or len(o.shape) < 2:
            continue
        p, v = g.node(o.inputs[0]), g.node(o.inputs[1])
        if p.op is Op.CAST and _single_user(users, p.id, outputs):
            sm = g.node(p.inputs[0])
        else:
            sm = p
        if sm.op is not Op.SOFTMAX or not _single_user(users, sm.id, outputs) or sm.dtype not in SCORE_DTYPES:
            continue
        if sm.attr("dim") % len(sm.shape) != len(sm.shape) - 1:
            continue
        x = g.node(sm.inputs[0])
        causal, fill = False, None
        if x.op is Op.WHERE:
            mask, then, other = (g.node(i) for i in x.inputs)
            if not (_single_user(users, x.id, outputs) and _causal_mask(g, mask.id) and other.op is Op.CONST
                    and tuple(other.shape) == () and isinstance(other.attr("value"), (int, float))):
                continue
            causal, fill = True, float(other.attr("value"))
            if fill != fill:
                continue                                    # NaN
            x = then
        scale = None
        if x.op is Op.MUL and _single_user(users, x.id, outputs):
            a, b = (g.node(i) for i in x.inputs)
            if tuple(b.shape) == () and b.dtype == x.dtype:
                scale, x = b.id, a
            elif tuple(a.shape) == () and a.dtype == x.dtype:
                scale, x = a.id, b
            else:
                continue
        if x.dtype != sm.dtype or tuple(x.shape) != tuple(sm.shape):
            continue
        if x.op is Op.CAST and _single_user(users, x.id, outputs):
            x = g.node(x.inputs[0])
        if x.op is not Op.MATMUL or not _single_user(users, x.id, outputs):
            continue
        q, kt = g.node(x.inputs[0]), g.node(x.inputs[1])
        rank = len(q.shape)
        if rank < 2 or len(kt.shape) != rank or len(v.shape) != rank or len(o.shape) != rank:
            continue
        batch = tuple(q.shape[:-2])
        if tuple(kt.shape[:-2]) != batch or tuple(v.shape[:-2]) != batch or tuple(x.shape) != tuple(sm.shape):
            continue
        if q.dtype not in ("bfloat16", "float16", "float32", "float64") or p.dtype != v.dtype:
            continue
        found[o.id] = Attention(o.id, q.id, kt.id, v.id, scale, causal, fill, sm.dtype)
    return found


def attention_vjp(A, att: Attention, g: int) -> None:
    """Accumulates the gradients of q, kT and v given the gradient `g` of the output (module doc)."""
    o, q, kt, v = (A.node(i) for i in (att.out, att.q, att.kt, att.v))
    attrs = dict(causal=True, fill=att.fill) if att.causal else {}
    scale = att.scale if att.scale is not None else A.const(1.0, att.dtype)
    rows = tuple(q.shape[:-1])
    lse = A.add(Op.ATTN_LSE, (q.id, kt.id, scale), dtype=att.dtype, shape=rows, attrs=attrs_of(**attrs), src=o.src)

    def wide(nid: int) -> int:
        n = A.node(nid)
        return nid if n.dtype == att.dtype else A.add(Op.CAST, (nid,), n, dtype=att.dtype)
    prod = A.add(Op.MUL, (wide(g), wide(o.id)), o, dtype=att.dtype)
    delta = A.add(Op.SUM, (prod,), o, dtype=att.dtype, shape=rows, attrs=attrs_of(dim=len(rows), keepdim=False))
    rank = len(kt.shape)
    for wrt, node in (("q", q), ("k", kt), ("v", v)):
        # The op gives k's gradient [..., S, D]: kT's is its transpose (a view).
        shape = tuple(node.shape[:-2]) + (node.shape[-1], node.shape[-2]) if wrt == "k" else tuple(node.shape)
        grad = A.add(Op.ATTN_GRAD, (q.id, kt.id, v.id, g, lse, delta, scale), node, shape=shape,
                     attrs=attrs_of(wrt=wrt, **attrs), src=o.src)
        if wrt == "k":
            grad = A.add(Op.TRANSPOSE, (grad,), node, attrs=attrs_of(dim0=rank - 2, dim1=rank - 1), src=o.src)
        A.accumulate(node.id, grad)


__all__ = ["Attention", "attention_vjp", "find_attention"]
