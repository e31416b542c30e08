"""The ATen op table: one translation per op packet (`aten.linear`, …) into Graph IR.

Each entry takes (translator, fx node, args, kwargs) with fx nodes already replaced by their IR
values (a `Ref`, a Python scalar, a size, or a tuple of these) and returns the op's value. Shapes
the IR cannot infer by itself (view, expand, arange) come from the node's `meta["val"]`. Both the
high-level ops `torch.export` records and the core ATen ops `run_decompositions` leaves are here;
shape, source, convolution and pooling ops are in aten_shape_ops.py.
"""

from __future__ import annotations

import math
import operator

from ..ir.graph import Op
from ..ir.shapes import FLOATS
from ..ops import ATEN, BINARY, UNARY
from . import composites as C
from .aten_table import TABLE, arg, op, out_dtype, tensor
from .builder import TranslationError, is_node


# --- element-wise ---------------------------------------------------------------------------------
# The ATen ops that are one XG element-wise op (their `OpDef.aten`, compiler/ops).
_UNARY = {name: o for name, o in ATEN.items() if o in UNARY}


def _unary(t, node, args, kwargs):
    return t.b.unary(_UNARY[str(node.target.overloadpacket)], tensor(args[0], "the operand"))


for _name in _UNARY:
    TABLE[_name] = _unary


@op("aten.relu_", "aten.hardtanh")
def _relu_like(t, node, args, kwargs):
    if str(node.target.overloadpacket) == "aten.hardtanh":
        return _clamp(t, args[0], arg(args, kwargs, 1, "min_val", -1.0), arg(args, kwargs, 2, "max_val", 1.0))
    return t.b.unary(Op.RELU, args[0])


@op("aten.leaky_relu", "aten.elu", "aten.hardsigmoid", "aten.hardswish", "aten.softplus", "aten.mish",
    "aten.log1p", "aten.square", "aten.relu6", "aten.tril", "aten.triu")
def _activation(t, node, args, kwargs):
    """Activations written with existing element-wise ops (same formulas as torch's)."""
    b, x, name = t.b, args[0], str(node.target.overloadpacket)
    if name == "aten.leaky_relu":
        return b.where(b.compare(Op.GT, x, 0.0), x, b.binary(Op.MUL, x, float(arg(args, kwargs, 1, "negative_slope", 0.01))))
    if name == "aten.elu":
        alpha = float(arg(args, kwargs, 1, "alpha", 1.0))
        return b.where(b.compare(Op.GT, x, 0.0), x, b.binary(Op.MUL, b.binary(Op.SUB, b.unary(Op.EXP, x), 1.0), alpha))
    if name == "aten.hardsigmoid":
        return _clamp(t, b.binary(Op.ADD, b.binary(Op.DIV, x, 6.0), 0.5), 0.0, 1.0)
    if name == "aten.hardswish":
        return b.binary(Op.MUL, x, _clamp(t, b.binary(Op.ADD, b.binary(Op.DIV, x, 6.0), 0.5), 0.0, 1.0))
    if name == "aten.relu6":
        return _clamp(t, x, 0.0, 6.0)
    if name in ("aten.softplus", "aten.mish"):
        beta = float(arg(args, kwargs, 1, "beta", 1.0)) if name == "aten.softplus" else 1.0
        threshold = float(arg(args, kwargs, 2, "threshold", 20.0)) if name == "aten.softplus" else 20.0
        bx = b.binary(Op.MUL, x, beta)
        # log(1 + exp(bx)) / beta, and x itself where bx > threshold (as torch, to avoid overflow)
        soft = b.binary(Op.DIV, b.unary(Op.LOG, b.binary(Op.ADD, b.unary(Op.EXP, b.binary(Op.MINIMUM, bx, threshold)), 1.0)), beta)
        sp = b.where(b.compare(Op.GT, bx, threshold), x, soft)
        return sp if name == "aten.softplus" else b.binary(Op.MUL, x, b.unary(Op.TANH, sp))
    if name == "aten.log1p":
        return b.unary(Op.LOG, b.binary(Op.ADD, x, 1.0))
    if name == "aten.square":
        return b.binary(Op.MUL, x, x)
    # tril / triu: keep (i, j) with j - i <= k (tril) or >= k (triu), from IOTAs
    k = int(arg(args, kwargs, 1, "diagonal", 0))
    rows, cols = b.shape(x)[-2:]
    diff = b.binary(Op.SUB, b.reshape(b.iota(cols), (1, cols)), b.reshape(b.iota(rows), (rows, 1)))
    keep = b.compare(Op.LE if name == "aten.tril" else Op.GE, diff, k)
    zero = False if b.dtype(x) == "bool" else (0.0 if b.dtype(x) in FLOATS else 0)
    return b.where(keep, x, zero)


@op("aten.gelu")
def _gelu(t, node, args, kwargs):
    return C.gelu(t.b, args[0], kwargs.get("approximate", args[1] if len(args) > 1 else "none"))


_BINARY = {name: o for name, o in ATEN.items() if o in BINARY}


@op(*_BINARY, "aten.rsub")
def _binary(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    a, b = args[0], args[1]
    if name == "aten.rsub":
        a, b, name = b, a, "aten.sub"
    alpha = kwargs.get("alpha", 1)
    if alpha != 1:
        b = t.b.binary(Op.MUL, b, alpha) if is_node(b) else b * alpha
    if name == "aten.div" and kwargs.get("rounding_mode") is not None:
        raise TranslationError(f"division with rounding_mode={kwargs['rounding_mode']!r}")
    o = _BINARY[name]
    if o in (Op.AND, Op.OR):
        return _logical(t, name, o, a, b)
    if not is_node(a) and not is_node(b):
        return _PY[o](a, b)
    return t.b.binary(o, a, b, dtype=None if o in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE) else out_dtype(node))


def _as_bool(t, v):
    return t.b.cast(v, "bool") if is_node(v) else t.b.const(bool(v), "bool")


def _logical(t, name: str, o: Op, a, b):
    """and / or / xor (o: AND, OR, NE of bools): logical on any dtype; the bitwise forms only where
    they agree (bool operands)."""
    if not name.startswith("aten.logical_"):
        for v in (a, b):
            if (t.b.dtype(v) if is_node(v) else ("bool" if isinstance(v, bool) else "int64")) != "bool":
                raise TranslationError(f"{name} of integer tensors (bitwise; XG has logical and/or on bool)")
    if not is_node(a) and not is_node(b):
        return {Op.AND: operator.and_, Op.OR: operator.or_, Op.NE: operator.ne}[o](bool(a), bool(b))
    return t.b.op(o, [_as_bool(t, a), _as_bool(t, b)])


@op("aten.__and__", "aten.__or__", "aten.__xor__", "aten.bitwise_xor", "aten.logical_xor")
def _bool_ops(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    o = Op.NE if "xor" in name else (Op.AND if "and" in name else Op.OR)
    return _logical(t, name, o, args[0], args[1])


@op("aten.__invert__")
def _invert(t, node, args, kwargs):
    if t.b.dtype(args[0]) != "bool":
        raise TranslationError("~ of an integer tensor (bitwise; XG has logical not on bool)")
    return t.b.unary(Op.NOT, args[0])


_PY = {Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul, Op.DIV: operator.truediv}


@op("aten.reciprocal")
def _reciprocal(t, node, args, kwargs):
    return t.b.binary(Op.DIV, 1.0, args[0])


def _constant_scalar(t, ref, default=None):
    """The value of a 0-d constant (a `torch.full([], 0.25)`, a lifted `torch.tensor(2.0)` weight),
    else `default`: it broadcasts like a Python number."""
    n = t.b.node(ref)
    if n.shape:
        return default
    if n.op in (Op.FULL, Op.CONST):
        return n.attr("value")
    value = t.weights.get(n.attr("name")) if n.op is Op.INPUT else None
    if value is None:
        return default
    return value.item()


@op("aten.pow")
def _pow(t, node, args, kwargs):
    x, e = args[0], args[1]
    if is_node(x) and is_node(e):
        x = _constant_scalar(t, x, default=x)           # a lifted constant base (Bloom's ALiBi)
    if not is_node(x) and is_node(e) and isinstance(x, (int, float)) and x > 0:
        # a positive constant to tensor powers (ALiBi's slopes): exp(e * ln x), exact in form
        return t.b.unary(Op.EXP, t.b.binary(Op.MUL, t.b.cast(e, out_dtype(node)), math.log(x)))
    if not is_node(x) or is_node(e):
        raise TranslationError("pow with a tensor exponent (supported: a constant exponent, or a positive "
                               "constant base)")
    if e == 2:
        return t.b.binary(Op.MUL, x, x)
    if e == 1:
        return x
    if e == 0.5:
        return t.b.unary(Op.SQRT, x)
    if e == -0.5:
        return t.b.unary(Op.RSQRT, x)
    if e == 3:
        return t.b.binary(Op.MUL, t.b.binary(Op.MUL, x, x), x)
    if e == -1:
        return t.b.binary(Op.DIV, 1.0, x)
    raise TranslationError(f"pow with exponent {e} (supported: -1, 0.5, -0.5, 1, 2, 3)")


def _clamp(t, x, lo, hi):
    if lo is not None:
        x = t.b.binary(Op.MAXIMUM, x, lo)
    if hi is not None:
        x = t.b.binary(Op.MINIMUM, x, hi)
    return x


@op("aten.clamp", "aten.clip")
def _clamp_op(t, node, args, kwargs):
    return _clamp(t, args[0], arg(args, kwargs, 1, "min"), arg(args, kwargs, 2, "max"))


@op("aten.where")
def _where(t, node, args, kwargs):
    return t.b.where(args[0], args[1], args[2])


@op("aten.masked_fill")
def _masked_fill(t, node, args, kwargs):
    x, mask, value = args
    if is_node(value):
        raise TranslationError("masked_fill with a tensor value")
    return t.b.where(t.b.cast(mask, "bool"), float(value) if t.b.dtype(x) in FLOATS else value, x)


@op("aten._to_copy", "aten.to", "aten.type_as")
def _to(t, node, args, kwargs):
    return t.b.cast(args[0], out_dtype(node))


@op("aten.dropout", "aten.alpha_dropout", "aten.feature_dropout")
def _dropout(t, node, args, kwargs):
    train = arg(args, kwargs, 2, "train", False)
    if train and arg(args, kwargs, 1, "p", 0.0) > 0:
        raise TranslationError("dropout in training mode (call model.eval() before xg.compile)")
    return args[0]


@op("aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.lift_fresh_copy", "aten.lift_fresh")
def _identity(t, node, args, kwargs):
    return args[0]


# --- contractions ---------------------------------------------------------------------------------
@op("aten.linear")
def _linear(t, node, args, kwargs):
    return C.linear(t.b, args[0], args[1], arg(args, kwargs, 2, "bias"))


@op("aten.matmul", "aten.mm", "aten.bmm")
def _matmul(t, node, args, kwargs):
    return C.matmul(t.b, args[0], args[1])


@op("aten.addmm", "aten.baddbmm")
def _addmm(t, node, args, kwargs):
    """beta * bias + alpha * (x @ w), batched for baddbmm."""
    bias, x, w = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    out = C.matmul(t.b, x, w)
    if alpha != 1:
        out = t.b.binary(Op.MUL, out, alpha)
    if beta != 0:
        out = t.b.binary(Op.ADD, out, bias if beta == 1 else t.b.binary(Op.MUL, bias, beta))
    return out


@op("aten.t")
def _t(t, node, args, kwargs):
    return t.b.transpose(args[0], 0, 1) if t.b.rank(args[0]) == 2 else args[0]


@op("aten.scaled_dot_product_attention")
def _sdpa(t, node, args, kwargs):
    q, k, v = args[:3]
    mask = arg(args, kwargs, 3, "attn_mask")
    p = arg(args, kwargs, 4, "dropout_p", 0.0)
    if p:
        raise TranslationError("attention dropout (dropout_p > 0)")
    return C.attention(t.b, q, k, v, mask, bool(arg(args, kwargs, 5, "is_causal", False)),
                       arg(args, kwargs, 6, "scale"), bool(arg(args, kwargs, 7, "enable_gqa", False)))


@op("aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention")
def _sdpa_kernels(t, node, args, kwargs):
    """The fused SDPA variants export or decomposition may record: the output, no statistics."""
    name = str(node.target.overloadpacket)
    q, k, v = args[:3]
    if name.endswith("efficient_attention") or name.endswith("cudnn_attention"):
        mask, rest = args[3] if len(args) > 3 else kwargs.get("attn_bias"), args[5:]
    else:
        mask, rest = kwargs.get("attn_mask"), args[3:]
    p = rest[0] if rest else kwargs.get("dropout_p", 0.0)
    causal = rest[1] if len(rest) > 1 else kwargs.get("is_causal", False)
    if p:
        raise TranslationError("attention dropout (dropout_p > 0)")
    out = C.attention(t.b, q, k, v, mask, bool(causal), kwargs.get("scale"))
    for user in node.users:
        if user.target is operator.getitem and user.args[1] != 0 and user.users:
            raise TranslationError("the statistics outputs of a fused attention op")
    return (out,) + (None,) * 8


# --- normalisation, softmax -----------------------------------------------------------------------
@op("aten.layer_norm")
def _layer_norm(t, node, args, kwargs):
    x, shape = args[0], args[1]
    return C.layer_norm(t.b, x, len(shape), arg(args, kwargs, 2, "weight"), arg(args, kwargs, 3, "bias"),
                        float(arg(args, kwargs, 4, "eps", 1e-5)))


@op("aten.native_layer_norm")
def _native_layer_norm(t, node, args, kwargs):
    x, shape, w, bias, eps = args[:5]
    return (C.layer_norm(t.b, x, len(shape), w, bias, float(eps)), None, None)


@op("aten.rms_norm")
def _rms_norm(t, node, args, kwargs):
    x, shape = args[0], args[1]
    eps = arg(args, kwargs, 3, "eps")
    if eps is None:
        eps = 1.1920928955078125e-07       # torch's default: the float32 machine epsilon
    return C.rms_norm(t.b, x, len(shape), arg(args, kwargs, 2, "weight"), float(eps))


@op("aten.batch_norm")
def _batch_norm(t, node, args, kwargs):
    x, w, bias, mean, var, training = args[:6]
    eps = args[7] if len(args) > 7 else kwargs.get("eps", 1e-5)
    if training:
        raise TranslationError("batch norm in training mode (call model.eval() before xg.compile)")
    if mean is None or var is None:
        raise TranslationError("batch norm without running statistics")
    return C.batch_norm(t.b, x, w, bias, mean, var, float(eps))


@op("aten._native_batch_norm_legit_no_training")
def _bn_no_training(t, node, args, kwargs):
    x, w, bias, mean, var, _momentum, eps = args[:7]
    return (C.batch_norm(t.b, x, w, bias, mean, var, float(eps)), None, None)


@op("aten.group_norm")
def _group_norm(t, node, args, kwargs):
    return C.group_norm(t.b, args[0], int(args[1]), arg(args, kwargs, 2, "weight"), arg(args, kwargs, 3, "bias"),
                        float(arg(args, kwargs, 4, "eps", 1e-5)))


@op("aten.native_group_norm")
def _native_group_norm(t, node, args, kwargs):
    x, w, bias, _n, _c, _hw, groups, eps = args[:8]
    return (C.group_norm(t.b, x, int(groups), w, bias, float(eps)), None, None)


@op("aten._weight_norm")
def _weight_norm(t, node, args, kwargs):
    return C.weight_norm(t.b, args[0], args[1], int(arg(args, kwargs, 2, "dim", 0)))


@op("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax", "aten._safe_softmax")
def _softmax(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    return t.b.cast(C.softmax(t.b, args[0], int(args[1]), "log" in name, safe="_safe" in name), out_dtype(node))


@op("aten.embedding")
def _embedding(t, node, args, kwargs):
    table, idx = args[0], args[1]
    name = t.b.node(idx).attr("name") if t.b.node(idx).op is Op.INPUT else None
    if name is not None and name in t.inputs:
        size = t.b.shape(table)[0]
        lo, hi = t.ranges.get(name, (0, size))
        t.ranges[name] = (max(lo, 0), min(hi, size))
    return C.embedding(t.b, table, idx)


# --- reductions -----------------------------------------------------------------------------------
def _dims(v) -> list[int] | None:
    if v is None:
        return None
    return [int(v)] if isinstance(v, int) else [int(d) for d in v]


@op("aten.var", "aten.std", "aten.var_mean", "aten.std_mean")
def _var(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    x = args[0]
    rest = list(args[1:])
    unbiased = True
    if rest and isinstance(rest[0], bool):          # var(x, unbiased)
        unbiased, rest = rest[0], []
    dims = _dims(rest[0] if rest else kwargs.get("dim"))
    if len(rest) > 1 and isinstance(rest[1], bool):  # var(x, dim, unbiased, keepdim)
        unbiased = rest[1]
    correction = kwargs.get("correction")
    correction = (1 if kwargs.get("unbiased", unbiased) else 0) if correction is None else correction
    keep = bool(kwargs.get("keepdim", rest[2] if len(rest) > 2 else False))
    b = t.b
    shape = b.shape(x)
    n = 1
    for d in (range(len(shape)) if not dims else [d % len(shape) for d in dims]):
        if not isinstance(shape[d], int):
            raise TranslationError("variance over a symbolic dim")
        n *= shape[d]
    if n - correction <= 0:
        raise TranslationError(f"variance of {n} values with correction {correction}")
    mu = b.reduce(Op.MEAN, x, dims, True)
    d2 = b.binary(Op.MUL, b.binary(Op.SUB, x, mu), b.binary(Op.SUB, x, mu))
    var = b.binary(Op.DIV, b.reduce(Op.SUM, d2, dims, keep), float(n - correction))
    out = b.unary(Op.SQRT, var) if "std" in name else var
    if name.endswith("_mean"):
        return (out, b.reduce(Op.MEAN, x, dims, keep))
    return out


@op("aten.max", "aten.min")
def _max_dim(t, node, args, kwargs):
    """max(x) / max(x, dim) values (the indices are not supported), max(a, b) element-wise."""
    kind = Op.MAX if str(node.target.overloadpacket) == "aten.max" else Op.MIN
    if len(args) > 1 and is_node(args[1]):
        return t.b.binary(Op.MAXIMUM if kind is Op.MAX else Op.MINIMUM, args[0], args[1])
    if len(args) == 1:
        return t.b.reduce(kind, args[0], None, False)
    if len(node.users) and any(u.args[1] == 1 for u in node.users if u.target is operator.getitem):
        raise TranslationError("the indices of max/min over a dim (argmax)")
    return (t.b.reduce(kind, args[0], [int(args[1])], bool(arg(args, kwargs, 2, "keepdim", False))), None)


@op("aten.mean", "aten.sum", "aten.amax", "aten.amin")
def _reduce(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    kind = {"aten.mean": Op.MEAN, "aten.sum": Op.SUM, "aten.amax": Op.MAX, "aten.amin": Op.MIN}[name]
    dims = _dims(arg(args, kwargs, 1, "dim"))
    keep = bool(arg(args, kwargs, 2, "keepdim", False))
    x = args[0]
    if kind is Op.SUM and t.b.dtype(x) != out_dtype(node):
        x = t.b.cast(x, out_dtype(node))          # bool and narrow integers sum as int64, as torch
    out = t.b.reduce(kind, x, dims, keep)
    return t.b.cast(out, out_dtype(node))


@op("aten.any", "aten.all")
def _any_all(t, node, args, kwargs):
    kind = str(node.target.overloadpacket).rsplit(".", 1)[-1]
    dims = _dims(arg(args, kwargs, 1, "dim"))
    return C.reduce_bool(t.b, args[0], dims, bool(arg(args, kwargs, 2, "keepdim", False)), kind)


@op("aten.cumsum")
def _cumsum(t, node, args, kwargs):
    return t.b.cast(C.cumsum(t.b, args[0], int(arg(args, kwargs, 1, "dim"))), out_dtype(node))


@op("aten.diff")
def _diff(t, node, args, kwargs):
    """x[1:] - x[:-1] along `dim`, n times (prepend / append joined first)."""
    x = args[0]
    n, dim = int(arg(args, kwargs, 1, "n", 1)), int(arg(args, kwargs, 2, "dim", -1))
    pre, post = arg(args, kwargs, 3, "prepend"), arg(args, kwargs, 4, "append")
    parts = [v for v in (pre, x, post) if v is not None]
    if len(parts) > 1:
        x = C.cat(t.b, [t.b.cast(v, t.b.dtype(x)) for v in parts], dim)
    for _ in range(n):
        size = t.b.shape(x)[dim]
        if isinstance(size, int):
            hi, lo = t.b.slice(x, dim, 1, size), t.b.slice(x, dim, 0, size - 1)
        else:
            hi, lo = C.slice_dyn(t.b, x, dim, 1, size), C.slice_dyn(t.b, x, dim, 0, C.dim_expr(f"({size})-1"))
        x = t.b.op(Op.NE, [hi, lo]) if t.b.dtype(x) == "bool" else t.b.binary(Op.SUB, hi, lo)
    return x


# --- bookkeeping ops that compute nothing ---------------------------------------------------------
@op("aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
    "aten._assert_async", "aten.sym_constrain_range")
def _nothing(t, node, args, kwargs):
    return None


@op("aten.sym_size", "aten.sym_numel", "_operator.mul", "_operator.add", "_operator.sub",
    "_operator.floordiv", "torch.sym_int", "torch.sym_max", "torch.sym_min")
def _size(t, node, args, kwargs):
    val = node.meta.get("val")
    return t.dim(val) if val is not None else None

