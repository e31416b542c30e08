"""Neural-network building blocks as existing IR ops, shared by the PyTorch and ONNX importers.

Each block is written with ops that already have a GPU kernel path (docs/importers.md):
- linear, matmul: MATMUL (+ ADD), the weight read through a TRANSPOSE view;
- layer norm, RMSNorm, batch norm (eval), softmax, attention: reductions and element-wise ops;
  softmax over a dim other than the last is a softmax over the last between two TRANSPOSE views;
- embedding: a GATHER of table rows (an element-wise kernel: tokens x d reads), or a slice of the
  table when the indices are `arange`;
- indexing (index_select, torch.gather, advanced indexing, reflect/replicate padding, slices with
  symbolic bounds): GATHER of rows at computed indices, the indexed dims moved first and merged;
- padding and concatenation: UNINDEX (each output element from its source element, or zero),
  parts added; a non-zero pad value selected outside the input's box; any dtype;
- cumsum: a masked row reduction (its [.., n, n] operand is the reduction's prologue, never stored);
- conv (1-D, 2-D, 3-D; 1-D and 3-D through 2-D): one MATMUL per kernel tap over strided INDEX views (NHWC inside), accumulated in the
  matmul epilogues; depthwise taps are element-wise products;
- pooling: taps combined with MAXIMUM or ADD; adaptive average pooling as a reshape and means.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..ir.graph import BINARY, UNARY, Dim, Op
from ..ops.core import dim_expr
from ..ir.shapes import FLOATS
from .builder import INTS, IRBuilder, TranslationError, Ref, is_node

NEG_INF = float("-inf")


def _float(b: IRBuilder, x: Ref) -> Ref:
    return x if b.dtype(x) in FLOATS else b.cast(x, "float32")


def matmul(b: IRBuilder, x: Ref, y: Ref) -> Ref:
    """torch.matmul semantics, 1-D operands included (made 2-D and squeezed back)."""
    dt = b.dtype(x) if b.dtype(x) == b.dtype(y) else "float32"
    x, y = b.cast(x, dt), b.cast(y, dt)
    vec_x, vec_y = b.rank(x) == 1, b.rank(y) == 1
    if vec_x:
        x = b.reshape(x, (1,) + b.shape(x))
    if vec_y:
        y = b.reshape(y, b.shape(y) + (1,))
    out = b.op(Op.MATMUL, [x, y])
    shape = list(b.shape(out))
    if vec_y:
        shape.pop(-1)
    if vec_x:
        shape.pop(-1 if vec_y else -2)
    return b.reshape(out, tuple(shape))


def linear(b: IRBuilder, x: Ref, w: Ref, bias: Ref | None) -> Ref:
    """x @ w.T + bias, w of shape [out, in] (PyTorch's layout) read through a transpose view."""
    out = matmul(b, x, b.transpose(w, 0, 1))
    return b.binary(Op.ADD, out, bias) if bias is not None else out


def gelu(b: IRBuilder, x: Ref, approximate: str = "none") -> Ref:
    if approximate == "none":
        return b.unary(Op.GELU, x)
    if approximate != "tanh":
        raise TranslationError(f"gelu approximation {approximate!r} (supported: 'none', 'tanh')")
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    cube = b.binary(Op.MUL, b.binary(Op.MUL, x, x), x)
    inner = b.binary(Op.MUL, b.binary(Op.ADD, x, b.binary(Op.MUL, cube, 0.044715)), math.sqrt(2.0 / math.pi))
    return b.binary(Op.MUL, b.binary(Op.MUL, x, 0.5), b.binary(Op.ADD, b.unary(Op.TANH, inner), 1.0))


def softmax(b: IRBuilder, x: Ref, dim: int, log: bool = False, safe: bool = False) -> Ref:
    """softmax (log_softmax) along `dim`; `safe`: a row whose every input is -inf gives zeros, not
    NaN (torch's `_safe_softmax`, what attention gives a query its mask leaves no key)."""
    x = _float(b, x)
    r = b.rank(x)
    if r == 0:
        return b.full(0.0 if log else 1.0, b.dtype(x), ())
    dim %= r
    op = Op.LOG_SOFTMAX if log else Op.SOFTMAX
    extra = {"safe": True} if safe and not log else {}
    if dim == r - 1:
        return b.op(op, [x], dim=dim, **extra)
    y = b.op(op, [b.transpose(x, dim, r - 1)], dim=r - 1, **extra)
    return b.transpose(y, dim, r - 1)


def layer_norm(b: IRBuilder, x: Ref, ndims: int, w: Ref | None, bias: Ref | None, eps: float) -> Ref:
    """Normalise over the last `ndims` dims (merged into one, then split back)."""
    shape = b.shape(x)
    y = x
    if ndims > 1:
        tail = shape[-ndims:]
        if not all(isinstance(d, int) for d in tail):
            raise TranslationError("layer norm over symbolic dims")
        y = b.reshape(x, shape[:-ndims] + (math.prod(tail),))
    mu = b.op(Op.MEAN, [y], dim=b.rank(y) - 1, keepdim=True)
    d = b.binary(Op.SUB, y, mu)
    var = b.op(Op.MEAN, [b.binary(Op.MUL, d, d)], dim=b.rank(y) - 1, keepdim=True)
    y = b.binary(Op.MUL, d, b.unary(Op.RSQRT, b.binary(Op.ADD, var, eps)))
    y = b.reshape(y, shape)
    if w is not None:
        y = b.binary(Op.MUL, y, w)
    if bias is not None:
        y = b.binary(Op.ADD, y, bias)
    return y


def rms_norm(b: IRBuilder, x: Ref, ndims: int, w: Ref | None, eps: float) -> Ref:
    shape = b.shape(x)
    y = x
    if ndims > 1:
        y = b.reshape(x, shape[:-ndims] + (math.prod(shape[-ndims:]),))
    ms = b.op(Op.MEAN, [b.binary(Op.MUL, y, y)], dim=b.rank(y) - 1, keepdim=True)
    y = b.reshape(b.binary(Op.MUL, y, b.unary(Op.RSQRT, b.binary(Op.ADD, ms, eps))), shape)
    return b.binary(Op.MUL, y, w) if w is not None else y


def group_norm(b: IRBuilder, x: Ref, groups: int, w: Ref | None, bias: Ref | None, eps: float) -> Ref:
    """GroupNorm over [N, C, *spatial]: each group's C/G channels and all positions normalised
    together (the group's elements merged into one row), then a per-channel affine."""
    shape = b.shape(x)
    n, c = shape[0], shape[1]
    if not isinstance(c, int) or c % groups:
        raise TranslationError(f"group norm of {c} channels in {groups} groups")
    spatial = shape[2:]
    y = layer_norm(b, b.reshape(x, (n, groups, _numel((c // groups,) + tuple(spatial)))), 1, None, None, eps)
    y = b.reshape(y, shape)
    per_channel = (c,) + (1,) * len(spatial)
    if w is not None:
        y = b.binary(Op.MUL, y, b.reshape(w, per_channel))
    if bias is not None:
        y = b.binary(Op.ADD, y, b.reshape(bias, per_channel))
    return y


def weight_norm(b: IRBuilder, v: Ref, g: Ref, dim: int) -> Ref:
    """torch's weight norm: v scaled to norm g, the norm taken over every dim but `dim`."""
    r = b.rank(v)
    dims = [d for d in range(r) if d != dim % r] if dim != -1 or r == 0 else list(range(r))
    norm = b.unary(Op.SQRT, b.reduce(Op.SUM, b.binary(Op.MUL, v, v), dims, True))
    return b.binary(Op.MUL, v, b.binary(Op.DIV, g, norm))


def batch_norm(b: IRBuilder, x: Ref, w: Ref | None, bias: Ref | None, mean: Ref, var: Ref, eps: float) -> Ref:
    """Inference batch norm over dim 1: (x - mean) * rsqrt(var + eps) * w + b, per channel."""
    r = b.rank(x)
    per_channel = (b.shape(x)[1],) + (1,) * (r - 2)

    def chan(v: Ref) -> Ref:
        return b.reshape(v, per_channel)
    scale = b.unary(Op.RSQRT, b.binary(Op.ADD, chan(var), eps))
    if w is not None:
        scale = b.binary(Op.MUL, scale, chan(w))
    y = b.binary(Op.MUL, b.binary(Op.SUB, x, chan(mean)), scale)
    return b.binary(Op.ADD, y, chan(bias)) if bias is not None else y


def _repeated_heads(b: IRBuilder, k: Ref) -> tuple[Ref, int] | None:
    """`k` [..., H, S, D] as `(k5, n)` when it repeats each of H / n heads n times the way
    transformers' `repeat_kv` writes it (`k[:, :, None].expand(..., n, S, D).reshape(..., H, S, D)`,
    the expand a broadcast add of zeros): k5 [..., H / n, 1, S, D] is the value before the expand."""
    node = b.node(k)
    if node.op is not Op.RESHAPE or b.rank(k) < 3:
        return None
    wide = b.node(node.inputs[0])
    if wide.op is not Op.ADD or len(wide.shape) != b.rank(k) + 1:
        return None
    *lead, kv, n, s, d = wide.shape
    for small, zeros in (wide.inputs, wide.inputs[::-1]):
        z = b.node(zeros)
        if (z.op is Op.FULL and z.attr("value") == 0 and tuple(z.shape) == tuple(wide.shape)
                and b.shape(small) == (*lead, kv, 1, s, d) and isinstance(n, int) and n > 1
                and isinstance(kv, int) and b.shape(k) == (*lead, kv * n, s, d)):
            return small, n
    return None


def _grouped(b: IRBuilder, q: Ref, k: Ref, v: Ref, gqa: bool) -> tuple[Ref, Ref, int] | None:
    """Grouped-query attention's keys and values as [..., KVH, 1, S, D], one head for each group of
    n query heads, and n: from SDPA's `enable_gqa` (k and v have KVH heads) or from k and v
    repeated to q's H heads by `repeat_kv`. None for ordinary attention."""
    if gqa:
        if min(b.rank(q), b.rank(k), b.rank(v)) < 3:
            raise TranslationError("grouped-query attention (enable_gqa=True) needs heads at dim -3 of q, k and v")
        h, kv, vh = b.shape(q)[-3], b.shape(k)[-3], b.shape(v)[-3]
        if not all(isinstance(x, int) for x in (h, kv, vh)) or h % kv or h % vh:
            raise TranslationError(f"grouped-query attention (enable_gqa=True) needs q's heads ({h}) a multiple "
                                   f"of k's ({kv}) and v's ({vh})")

        if kv != vh or h == kv:     # (groups of two sizes, as torch allows: k and v each repeated)
            return None
        return b.unsqueeze(k, -3), b.unsqueeze(v, -3), h // kv
    rk, rv = _repeated_heads(b, k), _repeated_heads(b, v)
    if rk is None or rv is None or rk[1] != rv[1] or b.rank(q) != b.rank(k) or b.shape(q)[-3] != b.shape(k)[-3]:
        return None
    return rk[0], rv[0], rk[1]


def _repeat_heads(b: IRBuilder, x: Ref, heads: int) -> Ref:
    """x [..., KVH, S, D] with each head repeated heads / KVH times, as SDPA's enable_gqa reads it."""
    *lead, kv, s, d = b.shape(x)
    if kv == heads:
        return x
    wide = b.expand(b.unsqueeze(x, -3), (*lead, kv, heads // kv, s, d))
    return b.reshape(wide, (*lead, heads, s, d))


def _split_heads(b: IRBuilder, x: Ref, rank: int, kv: int, n: int) -> Ref:
    """`x`, broadcasting against [..., H, T, S] (H = kv * n), reshaped to broadcast against
    [..., kv, n, T, S]: its head dim split (or 1, 1 where it broadcasts over heads). A boolean
    mask made by element-wise ops is rebuilt from its operands split so, down to its leaves: a
    causal part `cols <= rows` stays a comparison of index vectors, which the attention kernel
    evaluates from its indices (and skips the blocks above the diagonal), never a loaded mask."""
    node = b.node(x)
    if b.rank(x) == 0:
        return x
    if b.dtype(x) == "bool" and node.op in (BINARY | UNARY) and not node.attrs:
        # (the node's own dtype: a cast's is not its input's)
        return b.op(node.op, [_split_heads(b, i, rank, kv, n) for i in node.inputs], dtype=node.dtype)
    s = b.shape(x)
    s = (1,) * (rank - len(s)) + tuple(s)
    heads = (1, 1) if s[-3] == 1 else (kv, n)
    return b.reshape(x, s[:-3] + heads + s[-2:])


def attention(b: IRBuilder, q: Ref, k: Ref, v: Ref, mask: Ref | None, causal: bool, scale: float | None,
              gqa: bool = False) -> Ref:
    """scaled_dot_product_attention: softmax(q k^T * scale + mask) v, the math form.
    A boolean mask keeps where true; a float mask is added to the scores.

    Grouped-query attention (`gqa`: SDPA's enable_gqa, or k and v written out per query head by
    `repeat_kv`) runs with the heads split in two, [..., KVH, n, T, D] against keys and values
    [..., KVH, 1, S, D]: the product broadcasts each key head over its n query heads, so the
    repeated keys and values are never materialised and the attention kernel reads each key
    head's rows in place."""
    grouped = _grouped(b, q, k, v, gqa)
    if gqa and grouped is None:
        k, v = (_repeat_heads(b, x, b.shape(q)[-3]) for x in (k, v))
    if grouped is not None:
        k5, v5, n = grouped
        shape, rank = b.shape(q), b.rank(q)
        kv = b.shape(k5)[-4]
        q5 = b.reshape(q, shape[:-3] + (kv, n) + shape[-2:])
        if mask is not None:
            mask = _split_heads(b, mask, rank, kv, n)
        out = attention(b, q5, k5, v5, mask, causal, scale)
        return b.reshape(out, shape[:-1] + b.shape(out)[-1:])
    e = b.shape(q)[-1]
    if scale is None:
        if not isinstance(e, int):
            raise TranslationError("attention with a symbolic head size needs an explicit scale")
        scale = 1.0 / math.sqrt(e)
    scores = b.binary(Op.MUL, matmul(b, q, b.transpose(k, -2, -1)), float(scale))
    t, s = b.shape(q)[-2], b.shape(k)[-2]
    if causal:
        rows = b.reshape(b.iota(t), (t, 1))
        cols = b.reshape(b.iota(s), (1, s))
        keep = b.compare(Op.LE, cols, rows)        # top-left aligned, as torch's is_causal
        scores = b.where(keep, scores, NEG_INF)
    if mask is not None:
        if b.dtype(mask) == "bool":
            scores = b.where(mask, scores, NEG_INF)
        else:
            scores = b.binary(Op.ADD, scores, b.cast(mask, b.dtype(scores)))
    # A query row the mask leaves no key (a padded query under a sliding window) attends to nothing:
    # zeros, as PyTorch's attention gives (its `_safe_softmax`), not the NaN of a softmax over -inf
    # alone. The fused attention kernel gives them from its row sums, with no pass over the mask.
    return matmul(b, softmax(b, scores, -1, safe=mask is not None), v)


def embedding(b: IRBuilder, table: Ref, idx: Ref) -> Ref:
    """table[idx] along dim 0: a slice when idx is `arange(n)`, else a GATHER (idx of any shape)."""
    n = b.node(idx)
    if n.op is Op.IOTA:
        return b.slice(table, 0, 0, n.shape[0])
    return b.op(Op.GATHER, [table, idx])


def size_value(b: IRBuilder, n: Dim, dtype: str = "int64") -> Ref | int:
    """The size `n` as a value: the integer itself, or for a symbolic size a 0-d tensor computed on
    the device (the count of an IOTA of that length), so index arithmetic stays symbolic."""
    if isinstance(n, int):
        return n
    return b.cast(b.binary(Op.ADD, b.op(Op.MAX, [b.iota(n)], dim=0, keepdim=False), 1), dtype)


def _wrap(b: IRBuilder, idx: Ref, n: Dim) -> Ref:
    """Negative indices counted from the end (`-1` is the last), as torch and ONNX index."""
    if b.dtype(idx) not in INTS:
        raise TranslationError(f"indices must be integers, got {b.dtype(idx)}")
    if b.node(idx).op is Op.IOTA:
        return idx
    return b.where(b.compare(Op.LT, idx, 0), b.binary(Op.ADD, idx, size_value(b, n, b.dtype(idx))), idx)


def _move(b: IRBuilder, x: Ref, src: int, dst: int) -> Ref:
    """x with dim `src` moved to position `dst` (the others keep their order): a view."""
    r = b.rank(x)
    order = [d for d in range(r) if d != src % r]
    order.insert(dst % r, src % r)
    return b.permute(x, order)


def take(b: IRBuilder, x: Ref, dim: int, idx: Ref) -> Ref:
    """`x` at indices `idx` along `dim` (ONNX Gather, index_select, x[:, idx]): shape
    x.shape[:dim] + idx.shape + x.shape[dim+1:]. A GATHER of rows of `x` viewed with `dim` first."""
    r = b.rank(x)
    dim %= r
    idx = _wrap(b, idx, b.shape(x)[dim])
    if dim == 0:
        return b.op(Op.GATHER, [x, idx])
    k = b.rank(idx)
    rows = b.op(Op.GATHER, [_move(b, x, dim, 0), idx])      # [*idx, *x[:dim], *x[dim+1:]]
    order = list(range(k, k + dim)) + list(range(k)) + list(range(k + dim, k + r - 1))
    return b.permute(rows, order)


def slice_dyn(b: IRBuilder, x: Ref, dim: int, start: Any, stop: Any) -> Ref:
    """x[start:stop] along `dim` where a bound is a symbolic size (`buffer[:, :seq]`): the length
    comes from the bounds and the rows are gathered at IOTA + start."""
    length = stop if start in (0, None) else dim_expr(f"({stop})-({start})")
    ramp = b.iota(length)
    if start not in (0, None):
        ramp = b.binary(Op.ADD, ramp, size_value(b, start) if isinstance(start, str) else int(start))
    return take(b, x, dim, ramp)


def gather_elements(b: IRBuilder, x: Ref, dim: int, idx: Ref) -> Ref:
    """torch.gather / ONNX GatherElements: out[..., i, ...] = x[..., idx[..., i, ...], ...] along
    `dim`. `x` viewed as rows of its `dim` (moved last, other dims merged) and one GATHER of the
    flat table at row * n + idx."""
    r = b.rank(x)
    dim %= r
    if b.rank(idx) != r:
        raise TranslationError(f"gather of a rank-{r} tensor with rank-{b.rank(idx)} indices")
    xs, ishape = b.shape(x), b.shape(idx)
    for d in range(r):                                  # idx may be smaller than x off `dim`
        if d != dim and xs[d] != ishape[d]:
            if not (isinstance(xs[d], int) and isinstance(ishape[d], int) and ishape[d] <= xs[d]):
                raise TranslationError(f"gather indices of shape {list(ishape)} for a tensor of shape {list(xs)}")
            x = b.slice(x, d, 0, ishape[d])
    n = b.shape(x)[dim]
    idx = _wrap(b, idx, n)
    xt, it = _move(b, x, dim, r - 1), _move(b, idx, dim, r - 1)
    lead = b.shape(it)[:-1]
    rows = _numel(lead)
    table = b.reshape(xt, (_mul(rows, n),))
    flat_idx = b.reshape(it, (rows, b.shape(it)[-1]))
    row0 = b.binary(Op.MUL, b.reshape(b.iota(rows, b.dtype(flat_idx)), (rows, 1)), size_value(b, n, b.dtype(flat_idx)))
    out = b.op(Op.GATHER, [table, b.binary(Op.ADD, row0, flat_idx)])
    return _move(b, b.reshape(out, b.shape(it)), r - 1, dim)


def _mul(a: Dim, c: Dim) -> Dim:
    if isinstance(a, int) and isinstance(c, int):
        return a * c
    if a == 1:
        return c
    if c == 1:
        return a
    return dim_expr(f"({a})*({c})")


def _numel(shape: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in shape:
        out = _mul(out, d)
    return out


def advanced_index(b: IRBuilder, x: Ref, indices: Sequence[Ref | None]) -> Ref:
    """torch's `x[i0, i1, ...]` with index tensors (None: the whole dim), as torch.ops.aten.index:
    the index tensors broadcast together; their dims replace the indexed dims in place when those
    are adjacent, else they come first. The indexed dims are moved first and merged, and one
    GATHER reads rows at the linear index."""
    from ..ops.core import BroadcastError, broadcast
    r = b.rank(x)
    if len(indices) > r:
        raise TranslationError(f"{len(indices)} indices for a rank-{r} tensor")
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        return x
    for d in dims:
        if b.dtype(indices[d]) == "bool":
            raise TranslationError("indexing with a boolean mask (its result's size depends on the data)")
    shape: tuple = ()
    try:
        for d in dims:
            shape = broadcast(shape, b.shape(indices[d]))
    except BroadcastError as exc:
        raise TranslationError(f"index tensors do not broadcast: {exc}") from None
    if len(dims) == 1:
        return take(b, x, dims[0], indices[dims[0]])
    xs = b.shape(x)
    lin = None
    for d in dims:                                       # row-major linear index over the indexed dims
        i = _wrap(b, indices[d], xs[d])
        lin = i if lin is None else b.binary(Op.ADD, b.binary(Op.MUL, lin, size_value(b, xs[d], b.dtype(lin))), i)
    rest = [d for d in range(r) if d not in dims]
    moved = b.permute(x, dims + rest)
    table = b.reshape(moved, (_numel([xs[d] for d in dims]),) + tuple(xs[d] for d in rest))
    out = b.op(Op.GATHER, [table, b.expand(lin, shape) if b.shape(lin) != shape else lin])
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    if adjacent and dims[0] > 0:                         # x[:, i, j]: the index dims stay in place
        k = len(shape)
        order = list(range(k, k + dims[0])) + list(range(k)) + list(range(k + dims[0], k + len(rest)))
        out = b.permute(out, order)
    return out


def cumsum(b: IRBuilder, x: Ref, dim: int, exclusive: bool = False, reverse: bool = False) -> Ref:
    """Running sums along `dim` (torch.cumsum, ONNX CumSum), exact for integers: element i is the
    sum of the row's elements j <= i (j < i exclusive; j >= i reversed), one masked row reduction
    whose [.., n, n] operand is a prologue of the reduction kernel, never stored."""
    r = b.rank(x)
    if r == 0:
        return x
    dim %= r
    if b.dtype(x) == "bool":
        x = b.cast(x, "int64")
    n = b.shape(x)[dim]
    xt = _move(b, x, dim, r - 1)                        # [..., n]
    lead = b.shape(xt)[:-1]
    i = b.reshape(b.iota(n), (n, 1))
    j = b.reshape(b.iota(n), (1, n))
    op = (Op.GT if exclusive else Op.GE) if reverse else (Op.LT if exclusive else Op.LE)
    keep = b.compare(op, j, i)                          # [n, n]: row i sums column j
    rows = b.reshape(xt, tuple(lead) + (1, n))
    zero = False if b.dtype(x) == "bool" else (0.0 if b.dtype(x) in FLOATS else 0)
    masked = b.where(keep, rows, zero)                  # [..., n, n]
    out = b.op(Op.SUM, [masked], dim=r, keepdim=False)  # [..., n]
    return _move(b, b.cast(out, b.dtype(x)), r - 1, dim)


def reduce_bool(b: IRBuilder, x: Ref, dims: Sequence[int] | None, keepdim: bool, kind: str) -> Ref:
    """any / all over `dims`: MAX / MIN of the values as 0/1 integers, compared back to bool."""
    as_int = b.cast(x if b.dtype(x) == "bool" else b.compare(Op.NE, x, 0), "int32")
    red = b.reduce(Op.MAX if kind == "any" else Op.MIN, as_int, dims, keepdim)
    return b.compare(Op.NE, red, 0)


def place(b: IRBuilder, x: Ref, dim: int, total: int, offset: int) -> Ref:
    """A tensor of size `total` along `dim`, zero (false) except `x` at [offset, offset + n): an
    UNINDEX, the kernel that writes each output element from its source element or zero."""
    return pad(b, x, [(0, 0)] * (dim % b.rank(x)) + [(offset, total - offset - b.shape(x)[dim])])


def cat(b: IRBuilder, xs: Sequence[Ref], dim: int) -> Ref:
    """torch.cat / ONNX Concat along `dim`, any dtype: each part placed (UNINDEX) at its offset and
    the parts added (or-ed, for bool). Parts of size 0 are dropped."""
    if len(xs) == 1:
        return xs[0]
    r = b.rank(xs[0])
    dim %= r
    sizes = [b.shape(x)[dim] for x in xs]
    if not all(isinstance(s, int) for s in sizes):
        return _cat_symbolic(b, xs, dim, sizes)
    total, out, offset = sum(sizes), None, 0
    combine = Op.OR if b.dtype(xs[0]) == "bool" else Op.ADD
    for x, n in zip(xs, sizes):
        if n:
            # A negated part is placed first and negated after (the zeros around it stay zeros
            # to add): the placement then reads the part's own input from memory, and no kernel
            # writes the negated part (rotary embeddings' rotate_half, `cat([-x2, x1])`).
            node = b.node(x)
            negate = node.op is Op.NEG and combine is Op.ADD
            placed = place(b, node.inputs[0] if negate else x, dim, total, offset)
            if negate:
                placed = b.unary(Op.NEG, placed)
            out = placed if out is None else b.op(combine, [out, placed])
        offset += n
    return out if out is not None else xs[0]


def _cat_symbolic(b: IRBuilder, xs: Sequence[Ref], dim: int, sizes: list) -> Ref:
    """Concatenation along a symbolic dim: each output position reads the part it falls in (a
    GATHER at the position less the part's offset, clamped into the part), selected by range."""
    total = dim_expr("+".join(f"({s})" for s in sizes))
    pos = b.iota(total)
    out, offset = None, 0
    for x, n in zip(xs, sizes):
        n_v = size_value(b, n)
        local = b.binary(Op.SUB, pos, offset) if not (isinstance(offset, int) and offset == 0) else pos
        last = b.binary(Op.SUB, n_v, 1) if is_node(n_v) else n_v - 1
        part = take(b, x, dim, b.binary(Op.MINIMUM, b.binary(Op.MAXIMUM, local, 0), last))
        if out is None:
            out = part
        else:
            r = b.rank(part)
            at = b.reshape(b.compare(Op.GE, local, 0), tuple(b.shape(pos)[0] if k == dim else 1 for k in range(r)))
            out = b.where(at, part, out)
        offset = b.binary(Op.ADD, offset, n_v) if is_node(offset) or is_node(n_v) else offset + n_v
    return out


def pad(b: IRBuilder, x: Ref, pads: Sequence[tuple[int, int]], value: Any = 0.0, mode: str = "constant") -> Ref:
    """`x` padded by (before, after) per dim from dim 0 (fewer pairs: the leading dims stay);
    a negative amount crops. Modes: "constant" (`value`), "reflect" (mirrored, the edge once),
    "replicate" (the edge repeated). Constant padding is one UNINDEX (plus a select of `value`
    outside the input when it is not zero); the others gather each padded dim at mirrored or
    clamped indices."""
    r = b.rank(x)
    pads = [tuple(int(v) for v in p) for p in pads] + [(0, 0)] * (r - len(pads))
    if len(pads) > r:
        raise TranslationError(f"{len(pads)} padded dims for a rank-{r} tensor")
    for d, (lo, hi) in enumerate(pads):                  # crop first
        if lo < 0 or hi < 0:
            size = b.shape(x)[d]
            if not isinstance(size, int):
                raise TranslationError(f"cropping the symbolic dim {size}")
            x = b.slice(x, d, max(-lo, 0), size - max(-hi, 0))
    pads = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    if not any(lo or hi for lo, hi in pads):
        return x
    shape = b.shape(x)
    for d, (lo, hi) in enumerate(pads):
        if (lo or hi) and not isinstance(shape[d], int):
            raise TranslationError(f"padding the symbolic dim {shape[d]}")
    if mode in ("reflect", "replicate"):
        for d, (lo, hi) in enumerate(pads):
            if not (lo or hi):
                continue
            n = shape[d]
            if mode == "reflect" and (lo >= n or hi >= n):
                raise TranslationError(f"reflect padding of {max(lo, hi)} on a dim of size {n}")
            j = b.binary(Op.SUB, b.iota(n + lo + hi), lo)
            if mode == "replicate":
                j = b.binary(Op.MINIMUM, b.binary(Op.MAXIMUM, j, 0), n - 1)
            else:                                         # (n-1) - |(n-1) - |j||
                j = b.binary(Op.SUB, n - 1, b.unary(Op.ABS, b.binary(Op.SUB, n - 1, b.unary(Op.ABS, j))))
            x = take(b, x, d, j)
        return x
    if mode != "constant":
        raise TranslationError(f"padding mode {mode!r} (supported: constant, reflect, replicate)")
    out_shape = tuple(s + lo + hi if lo or hi else s for s, (lo, hi) in zip(shape, pads))
    last = max(d for d, (lo, hi) in enumerate(pads) if lo or hi)
    items = tuple(("s", lo, lo + s, 1) if lo or hi else ("s", None, None, None)
                  for s, (lo, hi) in list(zip(shape, pads))[:last + 1])
    y = b.op(Op.UNINDEX, [x], dtype=b.dtype(x), shape=out_shape, items=items)
    if value in (0, 0.0, False) and not (isinstance(value, float) and math.copysign(1.0, value) < 0):
        return y
    inside = None                                        # the input's box, from IOTA comparisons
    for d, (lo, hi) in enumerate(pads):
        if not (lo or hi):
            continue
        at = b.reshape(b.iota(out_shape[d]), tuple(out_shape[d] if k == d else 1 for k in range(r)))
        box = b.op(Op.AND, [b.compare(Op.GE, at, lo), b.compare(Op.LT, at, lo + shape[d])])
        inside = box if inside is None else b.op(Op.AND, [inside, box])
    return b.where(inside, y, value)


def pad2d(b: IRBuilder, x: Ref, pads: Sequence[int], value: float = 0.0) -> Ref:
    """Pad the last two dims by (top, bottom, left, right) with `value`."""
    top, bottom, left, right = pads
    r = b.rank(x)
    return pad(b, x, [(0, 0)] * (r - 2) + [(top, bottom), (left, right)], value)


def _out_size(n: int, k: int, stride: int, dilation: int, ceil: bool = False) -> int:
    span = dilation * (k - 1) + 1
    return (-(-(n - span) // stride) if ceil else (n - span) // stride) + 1


def _tap(b: IRBuilder, x: Ref, kh: int, kw: int, ho: int, wo: int, stride: Sequence[int],
         dilation: Sequence[int]) -> Ref:
    """The strided window of x [B, C, H, W] that kernel tap (kh, kw) reads: [B, C, ho, wo]."""
    h0, w0 = kh * dilation[0], kw * dilation[1]
    items = [("s", None, None, None), ("s", None, None, None),
             ("s", h0, h0 + (ho - 1) * stride[0] + 1, stride[0]),
             ("s", w0, w0 + (wo - 1) * stride[1] + 1, stride[1])]
    h, w = b.shape(x)[-2:]
    if (h0, ho * stride[0], stride[0]) == (0, h, 1) and (w0, wo * stride[1], stride[1]) == (0, w, 1):
        return x
    return b.index(x, items)


def _im2col(b: IRBuilder, x: Ref, kh_n: int, kw_n: int, ho: int, wo: int, stride: Sequence[int],
            dilation: Sequence[int]) -> Ref:
    """The windows of x [N, C, H, W] (padded already) that a convolution's output pixels read:
    [N, ho*wo, kh*kw*C], K ordered (kh, kw, c): one GATHER of the image's pixels as rows of C
    channels (x copied channels-last once) at row indices [N, ho, wo, kh, kw] (a C-th of the
    result), computed by one element-wise kernel from the linear position. O(1) work an element:
    a cat of the kh*kw taps placed along K costs kh*kw masked loads for each (ResNet-50's 7x7
    stem: 49 an element, 58 ms on an H200, and a kernel ptxas took 40 s over)."""
    n, c, h, wd = b.shape(x)
    rows = _mul(n, h * wd)
    table = b.reshape(b.permute(x, (0, 2, 3, 1)), (rows, c))                    # [N*H*W, C]
    dt = "int32" if isinstance(rows, int) and rows < 2 ** 31 else "int64"
    lin = b.iota(_mul(n, ho * wo * kh_n * kw_n), "int64")
    idx, inner = None, 1
    # (size, row step) of each index dim, innermost first: the row is sum(coordinate * step), each
    # coordinate (lin % (inner * size)) // inner, the quotient exact in float64 (< 2**53).
    dims = ((kw_n, dilation[1]), (kh_n, dilation[0] * wd), (wo, stride[1]), (ho, stride[0] * wd), (n, h * wd))
    for d, (size, step) in enumerate(dims):
        if size == 1:
            continue
        outer = d == len(dims) - 1
        at = lin if outer else b.binary(Op.MOD, lin, inner * size)
        if inner != 1:
            at = b.cast(b.binary(Op.DIV, b.cast(at, "float64"), float(inner)), "int64")
        term = b.binary(Op.MUL, at, step) if step != 1 else at
        idx = term if idx is None else b.binary(Op.ADD, idx, term)
        if not outer:
            inner *= size
    idx = b.binary(Op.MUL, lin, 0) if idx is None else idx
    idx = b.reshape(b.cast(idx, dt), (n, ho, wo, kh_n, kw_n))
    cols = b.op(Op.GATHER, [table, idx])                                        # [N, ho, wo, kh, kw, C]
    return b.reshape(cols, (n, ho * wo, kh_n * kw_n * c))


def conv2d(b: IRBuilder, x: Ref, w: Ref, bias: Ref | None, stride: Sequence[int], pads: Sequence[int],
           dilation: Sequence[int], groups: int) -> Ref:
    """NCHW convolution; `pads` is (top, bottom, left, right)."""
    if b.rank(x) != 4:
        raise TranslationError(f"conv2d of a rank-{b.rank(x)} input (NCHW expected)")
    x = pad2d(b, x, pads)
    n, c, h, wd = b.shape(x)
    o, cg, kh_n, kw_n = b.shape(w)
    if not all(isinstance(d, int) for d in (c, h, wd)):
        raise TranslationError("conv2d with symbolic channels or image size")
    ho, wo = _out_size(h, kh_n, stride[0], dilation[0]), _out_size(wd, kw_n, stride[1], dilation[1])
    if ho < 1 or wo < 1:
        raise TranslationError(f"conv2d kernel {kh_n}x{kw_n} larger than the padded input {h}x{wd}")
    og = o // groups
    depthwise = groups > 1 and cg == 1 and og == 1
    acc = None
    if groups == 1 and tuple(stride) == (kh_n, kw_n) and tuple(dilation) == (1, 1) and not any(pads) \
            and kh_n * kw_n > 1 and isinstance(o, int):
        # Patches that tile the image (a ViT's patch embedding): each patch's pixels side by side,
        # then one matmul with K = C*kh*kw, instead of a matmul per tap.
        xs = x
        if h != ho * kh_n:
            xs = b.slice(xs, 2, 0, ho * kh_n)
        if wd != wo * kw_n:
            xs = b.slice(xs, 3, 0, wo * kw_n)
        patches = b.permute(b.reshape(xs, (n, c, ho, kh_n, wo, kw_n)), (0, 2, 4, 1, 3, 5))
        cols = b.reshape(patches, (n, ho, wo, c * kh_n * kw_n))
        acc = b.op(Op.MATMUL, [cols, b.transpose(b.reshape(w, (o, c * kh_n * kw_n)), 0, 1)])
    elif groups == 1 and isinstance(o, int):
        # One matmul per image, W [O, K] @ cols [K, ho*wo], K = kh*kw*C ordered (kh, kw, c):
        # cols gathered [ho*wo, K] (`_im2col`; read as B stored [N, K]), the strided window of x
        # for a single tap (x itself for a 1x1 convolution of stride 1). One float32-accumulated
        # product rounded once, as cuDNN's (a matmul per tap rounded each tap's partial sum), the
        # result in NCHW order with no permute, and the image's pixels as the product's long N dim.
        if kh_n * kw_n == 1:
            cols = b.reshape(_tap(b, x, 0, 0, ho, wo, stride, dilation), (n, c, ho * wo))   # [N, K, ho*wo]
        else:
            cols = b.transpose(_im2col(b, x, kh_n, kw_n, ho, wo, stride, dilation), 1, 2)
        wk = b.reshape(b.permute(w, (0, 2, 3, 1)), (o, kh_n * kw_n * c))       # [O, K]
        y = b.op(Op.MATMUL, [wk, cols])                                         # [N, O, ho*wo]
        if bias is not None:
            y = b.binary(Op.ADD, y, b.reshape(bias, (o, 1)))
        return b.reshape(y, (n, o, ho, wo))
    for kh in range(kh_n if acc is None else 0):
        for kw in range(kw_n):
            tap = b.permute(_tap(b, x, kh, kw, ho, wo, stride, dilation), (0, 2, 3, 1))   # [N, ho, wo, C]
            wk = b.index(w, [("s", None, None, None), ("s", None, None, None), ("i", kh), ("i", kw)])  # [O, cg]
            if groups == 1:
                term = b.op(Op.MATMUL, [tap, b.transpose(wk, 0, 1)])
            elif depthwise:
                term = b.binary(Op.MUL, tap, b.reshape(wk, (o,)))
            else:
                xs = b.reshape(tap, (n, ho, wo, groups, 1, cg))
                wg = b.transpose(b.reshape(wk, (groups, og, cg)), 1, 2)          # [G, cg, og]
                term = b.reshape(b.op(Op.MATMUL, [xs, wg]), (n, ho, wo, o))
            acc = term if acc is None else b.binary(Op.ADD, acc, term)
    if bias is not None:
        acc = b.binary(Op.ADD, acc, bias)
    return b.permute(acc, (0, 3, 1, 2))


def conv(b: IRBuilder, x: Ref, w: Ref, bias: Ref | None, stride: Sequence[int], pads: Sequence[tuple[int, int]],
         dilation: Sequence[int], groups: int) -> Ref:
    """N-D convolution, channels first, 1 to 3 spatial dims; `pads` is (before, after) per spatial
    dim. 1-D runs as 2-D over a height of one; 3-D as a sum over the depth taps of 2-D
    convolutions of the strided depth slices (each a batch of 2-D images)."""
    nd = b.rank(x) - 2
    if nd not in (1, 2, 3) or b.rank(w) != nd + 2:
        raise TranslationError(f"convolution of a rank-{b.rank(x)} input with a rank-{b.rank(w)} weight "
                               "(1-D, 2-D or 3-D, channels first)")
    stride, dilation = list(stride), list(dilation)
    pads = [tuple(p) for p in pads]
    if nd == 1:
        n, c, length = b.shape(x)
        o, cg, k = b.shape(w)
        y = conv2d(b, b.reshape(x, (n, c, 1, length)), b.reshape(w, (o, cg, 1, k)), bias, (1, stride[0]),
                   (0, 0) + pads[0], (1, dilation[0]), groups)
        return b.reshape(y, (n, o, b.shape(y)[-1]))
    if nd == 2:
        return conv2d(b, x, w, bias, stride, pads[0] + pads[1], dilation, groups)
    x = pad(b, x, [(0, 0), (0, 0), pads[0]])
    n, c, depth, h, wd = b.shape(x)
    o, cg, kd_n = b.shape(w)[:3]
    if not isinstance(depth, int):
        raise TranslationError("3-D convolution over a symbolic depth")
    do = _out_size(depth, kd_n, stride[0], dilation[0])
    if do < 1:
        raise TranslationError(f"3-D convolution kernel depth {kd_n} larger than the padded input depth {depth}")
    acc = None
    for kd in range(kd_n):
        d0 = kd * dilation[0]
        xs = b.index(x, [("s", None, None, None)] * 2 + [("s", d0, d0 + (do - 1) * stride[0] + 1, stride[0])])
        xs = b.reshape(b.transpose(xs, 1, 2), (_mul(n, do), c, h, wd))           # [N*do, C, H, W]
        wk = b.index(w, [("s", None, None, None)] * 2 + [("i", kd)])             # [O, cg, kh, kw]
        term = conv2d(b, xs, wk, None, stride[1:], pads[1] + pads[2], dilation[1:], groups)
        acc = term if acc is None else b.binary(Op.ADD, acc, term)
    ho, wo = b.shape(acc)[-2:]
    y = b.transpose(b.reshape(acc, (n, do, o, ho, wo)), 1, 2)
    if bias is not None:
        y = b.binary(Op.ADD, y, b.reshape(bias, (o, 1, 1, 1)))
    return y


def pool2d(b: IRBuilder, x: Ref, kind: str, kernel: Sequence[int], stride: Sequence[int], pads: Sequence[int],
           dilation: Sequence[int] = (1, 1), ceil_mode: bool = False, count_include_pad: bool = True,
           divisor: int | None = None) -> Ref:
    """max or avg pooling over the last two dims; `pads` is (top, bottom, left, right)."""
    h, w = b.shape(x)[-2:]
    if not all(isinstance(d, int) for d in (h, w)):
        raise TranslationError("pooling over symbolic image sizes")
    hp, wp = h + pads[0] + pads[1], w + pads[2] + pads[3]
    ho = _out_size(hp, kernel[0], stride[0], dilation[0], ceil_mode)
    wo = _out_size(wp, kernel[1], stride[1], dilation[1], ceil_mode)
    if ceil_mode and ((ho - 1) * stride[0] + dilation[0] * (kernel[0] - 1) >= hp
                      or (wo - 1) * stride[1] + dilation[1] * (kernel[1] - 1) >= wp):
        raise TranslationError("pooling with ceil_mode where the last window leaves the input")
    fill = NEG_INF if kind == "max" else 0.0
    xp = pad2d(b, _float(b, x), pads, fill)
    acc = None
    for kh in range(kernel[0]):
        for kw in range(kernel[1]):
            tap = _tap(b, xp, kh, kw, ho, wo, stride, dilation)
            acc = tap if acc is None else b.op(Op.MAXIMUM if kind == "max" else Op.ADD, [acc, tap])
    if kind == "max":
        return acc
    if divisor is not None:
        return b.binary(Op.DIV, acc, float(divisor))
    if count_include_pad or not any(pads):
        return b.binary(Op.DIV, acc, float(kernel[0] * kernel[1]))
    # Count only the real (unpadded) positions of each window.
    ones = pad2d(b, b.full(1.0, b.dtype(acc), (h, w)), pads)
    count = None
    for kh in range(kernel[0]):
        for kw in range(kernel[1]):
            tap = _tap(b, b.reshape(ones, (1, 1, hp, wp)), kh, kw, ho, wo, stride, dilation)
            count = tap if count is None else b.binary(Op.ADD, count, tap)
    return b.binary(Op.DIV, acc, count)


def adaptive_avg_pool2d(b: IRBuilder, x: Ref, out: Sequence[int]) -> Ref:
    """Windows that tile the input exactly: a reshape to [.., oh, kh, ow, kw] and two means."""
    *lead, h, w = b.shape(x)
    oh, ow = out
    if not (isinstance(h, int) and isinstance(w, int)) or h % oh or w % ow:
        raise TranslationError(f"adaptive average pooling of {h}x{w} to {oh}x{ow} (the output must divide the input)")
    y = _float(b, x)
    if (oh, ow) == (1, 1):
        y = b.op(Op.MEAN, [b.reshape(y, tuple(lead) + (h * w,))], dim=len(lead), keepdim=False)
        return b.reshape(y, tuple(lead) + (1, 1))
    y = b.reshape(y, tuple(lead) + (oh, h // oh, ow, w // ow))
    r = b.rank(y)
    y = b.op(Op.MEAN, [y], dim=r - 1, keepdim=False)
    return b.op(Op.MEAN, [y], dim=r - 3, keepdim=False)
