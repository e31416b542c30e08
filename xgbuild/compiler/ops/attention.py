"""Attention's backward pass as ops that recompute the scores (flash-style), never holding them.

`passes/flash.py` finds `softmax(where(causal, (q @ kT) * scale, fill)) @ v` in a function being
differentiated and gives it these ops as its gradient, so the forward pass keeps nothing of size
[T, S] (its own kernel never writes the scores either) and the backward pass recomputes each
block of scores from q and kT:

- `attn_lse(q, kT, scale)`: each query row's log-sum-exp of its scores, [..., T], in scale's
  dtype (the softmax's);
- `attn_grad(q, kT, v, dO, lse, delta, scale)`, `wrt` one of "q", "k", "v": the gradient of the
  attention output, given its gradient dO, with respect to q [..., T, D], k [..., S, D] (kT's
  gradient transposed: the layout a block of keys accumulates it in, and the one a head's
  gradient is read in to be merged, row by row) or v [..., S, DV]; delta is each query row's sum
  of dO * out (`sum(P * dP)` without P).

The scores `t` of a query row i and key j are `(q @ kT)[i, j]` rounded to q's dtype (as the
unfused product rounds), times scale, in scale's dtype; with `causal`, a key
after the query (j > i) scores `fill` instead. The probabilities are `p = exp(t - lse)`; then
dv = p^T @ dO (p rounded to v's dtype, as the forward's second product reads it), dp = dO @ v^T
(kept unrounded), ds = p * (dp - delta), zero where the causal mask dropped the score, times scale
and rounded to q's dtype; dq = ds @ kT^T and dk = ds^T @ q. In float64 (the CPU reference)
nothing rounds. The batch dims of every operand are the same (no broadcasting).
"""

from __future__ import annotations

from .core import FLOATS, Kind, Op, OpDef, ShapeError

WRT = ("q", "k", "v")


def _operands(node, ins) -> None:
    q, kt = ins[0][1], ins[1][1]
    if len(q) < 2 or len(kt) != len(q) or tuple(q[:-2]) != tuple(kt[:-2]) or q[-1] != kt[-2]:
        raise ShapeError(f"`{node.op.value}` needs q [..., T, D] and kT [..., D, S] with equal batch dims, "
                         f"got {list(q)} and {list(kt)}")
    if ins[0][0] != ins[1][0] or ins[0][0] not in FLOATS:
        raise ShapeError(f"`{node.op.value}` needs q and kT of one floating-point dtype, got {ins[0][0]} and {ins[1][0]}")
    scale = ins[-1]
    if scale[1] != () or scale[0] not in ("float32", "float64"):
        raise ShapeError(f"`{node.op.value}` needs a float32 or float64 scalar scale, got {scale[0]}{list(scale[1])}")


def _lse(node, ins):
    _operands(node, ins)
    return ins[-1][0], tuple(ins[0][1][:-1])


def _grad(node, ins):
    _operands(node, ins)
    (_dq, q), (_dk, kt), (dv, v), (ddo, do), (_dl, lse), (_dd, delta), _scale = ins
    rows = tuple(q[:-1])
    if len(v) != len(q) or tuple(v[:-1]) != tuple(kt[:-2]) + (kt[-1],):
        raise ShapeError(f"`attn_grad` needs v [..., S, DV] to match kT {list(kt)}, got {list(v)}")
    if tuple(do) != rows + (v[-1],) or ddo != dv:
        raise ShapeError(f"`attn_grad` needs dO {dv}{list(rows + (v[-1],))}, got {ddo}{list(do)}")
    if tuple(lse) != rows or tuple(delta) != rows:
        raise ShapeError(f"`attn_grad` needs lse and delta of shape {list(rows)}, got {list(lse)} and {list(delta)}")
    wrt = node.attr("wrt")
    if wrt not in WRT:
        raise ShapeError(f"`attn_grad` needs wrt in {WRT}, got {wrt!r}")
    if wrt == "k":
        return ins[1][0], tuple(kt[:-2]) + (kt[-1], kt[-2])
    return ins[WRT.index(wrt)]


def scores(node, q, kt, scale):
    """The scores `t` (module doc), in scale's dtype; torch tensors in, one out."""
    import torch
    t = torch.matmul(q, kt).to(scale.dtype) * scale
    if node.attr("causal", False):
        rows, cols = t.shape[-2], t.shape[-1]
        keep = torch.arange(cols)[None, :] <= torch.arange(rows)[:, None]
        t = torch.where(keep, t, torch.tensor(float(node.attr("fill")), dtype=t.dtype))
    return t


def _cpu_lse(node, args, dt):
    import torch
    q, kt, scale = args
    return torch.logsumexp(scores(node, q, kt, scale), dim=-1)


def _cpu_grad(node, args, dt):
    import torch
    q, kt, v, do, lse, delta, scale = args
    t = scores(node, q, kt, scale)
    p = torch.exp(t - lse.to(t.dtype)[..., None])
    wrt = node.attr("wrt")
    if wrt == "v":
        return torch.matmul(p.to(v.dtype).transpose(-1, -2), do)
    dp = torch.matmul(do.to(t.dtype), v.to(t.dtype).transpose(-1, -2))
    ds = p * (dp - delta.to(t.dtype)[..., None])
    if node.attr("causal", False):
        rows, cols = t.shape[-2], t.shape[-1]
        ds = torch.where(torch.arange(cols)[None, :] <= torch.arange(rows)[:, None], ds, 0.0)
    ds = (ds * scale).to(q.dtype)
    if wrt == "q":
        return torch.matmul(ds, kt.transpose(-1, -2))
    return torch.matmul(ds.transpose(-1, -2), q)


DEFS = (
    # No VJP: a second derivative through attention is not supported (autodiff names the op).
    OpDef(Op.ATTN_LSE, Kind.ATTENTION, 3, _lse, cpu=_cpu_lse),
    OpDef(Op.ATTN_GRAD, Kind.ATTENTION, 7, _grad, attrs=("wrt",), cpu=_cpu_grad),
)
