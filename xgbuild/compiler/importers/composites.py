"""Neural-network building blocks as existing IR ops, shared by the PyTorch and ONNX importers.

Each block is written with ops that already have a GPU kernel path (docs/importers.md):
- linear, matmul: MATMUL (+ ADD), the weight read through a TRANSPOSE view;
- layer norm, RMSNorm, batch norm (eval), softmax, attention: reductions and element-wise ops;
  softmax over a dim other than the last is a softmax over the last between two TRANSPOSE views;
- embedding: a GATHER of table rows (an element-wise kernel: tokens x d reads), or a slice of the
  table when the indices are `arange`;
- placing a tensor inside a larger zero tensor (padding, concatenation) along one dim: a MATMUL
  with a 0/1 selection matrix built from IOTA and a comparison (exact for finite values);
- conv2d: one MATMUL per kernel tap over strided INDEX views (NHWC inside), accumulated in the
  matmul epilogues; depthwise taps are element-wise products;
- pooling: taps combined with MAXIMUM or ADD; adaptive average pooling as a reshape and means.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..ir.graph import Op
from ..ir.shapes import FLOATS
from .builder import IRBuilder, TranslationError, Ref

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


def softmax(b: IRBuilder, x: Ref, dim: int, log: bool = False) -> Ref:
    x = _float(b, x)
    r = b.rank(x)
    if r == 0:
        return b.full(0.0 if log else 1.0, b.dtype(x), ())
    dim %= r
    op = Op.LOG_SOFTMAX if log else Op.SOFTMAX
    if dim == r - 1:
        return b.op(op, [x], dim=dim)
    y = b.op(op, [b.transpose(x, dim, r - 1)], dim=r - 1)
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


def attention(b: IRBuilder, q: Ref, k: Ref, v: Ref, mask: Ref | None, causal: bool, scale: float | None) -> Ref:
    """scaled_dot_product_attention: softmax(q k^T * scale + mask) v, the math form.
    A boolean mask keeps where true; a float mask is added to the scores."""
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
    return matmul(b, softmax(b, scores, -1), v)


def embedding(b: IRBuilder, table: Ref, idx: Ref) -> Ref:
    """table[idx] along dim 0: a slice when idx is `arange(n)`, else a GATHER (idx of any shape)."""
    n = b.node(idx)
    if n.op is Op.IOTA:
        return b.slice(table, 0, 0, n.shape[0])
    return b.op(Op.GATHER, [table, idx])


def _selection(b: IRBuilder, n: int, total: int, offset: int, dtype: str) -> Ref:
    """The [n, total] 0/1 matrix with ones at (i, i + offset)."""
    rows = b.binary(Op.ADD, b.reshape(b.iota(n), (n, 1)), offset)
    cols = b.reshape(b.iota(total), (1, total))
    return b.cast(b.compare(Op.EQ, rows, cols), dtype)


def place(b: IRBuilder, x: Ref, dim: int, total: int, offset: int) -> Ref:
    """A tensor of size `total` along `dim`, zero except `x` at [offset, offset + n)."""
    r = b.rank(x)
    dim %= r
    n = b.shape(x)[dim]
    if not isinstance(n, int):
        raise TranslationError(f"padding or concatenating along the symbolic dim {n}")
    if b.dtype(x) not in FLOATS:
        raise TranslationError(f"padding or concatenating {b.dtype(x)} tensors (floating-point only)")
    if n == total and offset == 0:
        return x
    moved = b.transpose(x, dim, r - 1)
    out = b.op(Op.MATMUL, [moved, _selection(b, n, total, offset, b.dtype(x))])
    return b.transpose(out, dim, r - 1)


def cat(b: IRBuilder, xs: Sequence[Ref], dim: int) -> Ref:
    if len(xs) == 1:
        return xs[0]
    r = b.rank(xs[0])
    dim %= r
    sizes = [b.shape(x)[dim] for x in xs]
    if not all(isinstance(s, int) for s in sizes):
        raise TranslationError(f"concatenating along a symbolic dim ({sizes})")
    total, out, offset = sum(sizes), None, 0
    for x, n in zip(xs, sizes):
        if n:
            placed = place(b, x, dim, total, offset)
            out = placed if out is None else b.binary(Op.ADD, out, placed)
        offset += n
    return out


def pad2d(b: IRBuilder, x: Ref, pads: Sequence[int], value: float = 0.0) -> Ref:
    """Pad the last two dims by (top, bottom, left, right) with `value` (0 or -inf)."""
    top, bottom, left, right = pads
    if not any(pads):
        return x
    h, w = b.shape(x)[-2:]
    y = place(b, place(b, x, -1, w + left + right, left), -2, h + top + bottom, top)
    if value == 0.0:
        return y
    hp, wp = h + top + bottom, w + left + right
    r = b.reshape(b.iota(hp), (hp, 1))
    c = b.reshape(b.iota(wp), (1, wp))
    inside = b.op(Op.AND, [b.op(Op.AND, [b.compare(Op.GE, r, top), b.compare(Op.LT, r, top + h)]),
                           b.op(Op.AND, [b.compare(Op.GE, c, left), b.compare(Op.LT, c, left + w)])])
    return b.binary(Op.ADD, y, b.where(inside, 0.0, value))


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
