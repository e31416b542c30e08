"""The ONNX op table: one translation per op type into Graph IR (or into a folded static value).
Element-wise, contractions, norms, reductions, scans (CumSum), convolution of 1-3 spatial dims and
pooling here; shape, indexing and source ops in onnx_shape_ops.py.

Each entry takes (translator, onnx node, inputs, attributes); inputs are IR nodes (`Ref`) or
`Static` values. Shape arithmetic (Shape, Gather, Slice, Concat, … on sizes) folds at import, with
symbolic sizes as sympy expressions, so reshapes get concrete or symbolic target shapes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from ..ir.graph import Op
from ..ops import BINARY, COMPARE, ONNX, UNARY
from ..ir.shapes import FLOATS
from . import composites as C
from .builder import TranslationError, is_node
from .onnx_table import all_static, ints, op, static
from .onnx_values import NP_DTYPES, ONNX_DTYPES, Static

def _operand(t, v: Any, other_rank: int, hint: str):
    """A Python scalar for a one-element static that broadcasts away, else an IR node."""
    if isinstance(v, Static) and not v.symbolic and v.array.size == 1 and v.array.ndim <= other_rank:
        item = v.array.reshape(-1)[0]
        return bool(item) if v.dtype == "bool" else (float(item) if v.dtype in FLOATS else int(item))
    return t.tensor(v, hint)


# --- element-wise ---------------------------------------------------------------------------------
# The ONNX ops that are one XG element-wise op (their `OpDef.onnx`, compiler/ops). `Sum` is a
# variadic `Add`: every binary op here folds left over any number of inputs.
_BIN = {name: o for name, o in ONNX.items() if o in BINARY}
_UN = {name: o for name, o in ONNX.items() if o in UNARY}
# Shape arithmetic on static values (possibly sympy symbols in object arrays) folds here with
# numpy, before any IR exists; ops without an entry become IR nodes. A symbol compared with a
# number folds by sympy's structural equality (`batch == 1` is false): exporters' broadcast-shape
# arithmetic relies on that, as torch.export assumes a dynamic dim is never 0 or 1.
_STATIC = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.EQ: np.equal, Op.LT: np.less,
           Op.GT: np.greater, Op.LE: np.less_equal, Op.GE: np.greater_equal, Op.AND: np.logical_and,
           Op.OR: np.logical_or, Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum, Op.MOD: np.fmod}


def _fold_div(a: Static, b: Static) -> np.ndarray:
    if a.dtype in FLOATS:
        return a.array / b.array
    if a.array.dtype == object or b.array.dtype == object:
        return np.vectorize(lambda x, y: sympy.floor(sympy.sympify(x) / y), otypes=[object])(a.array, b.array)
    return np.trunc(a.array / b.array).astype(a.array.dtype)


@op(*_BIN)
def _binary(t, node, args, attrs):
    o = _BIN[node.op_type]
    args = [a for a in args if a is not None]
    if all_static(args) and (o in _STATIC or o is Op.DIV):
        acc = args[0]
        for nxt in args[1:]:
            arr = _fold_div(acc, nxt) if o is Op.DIV else _STATIC[o](acc.array, nxt.array)
            dt = "bool" if o in COMPARE or o in (Op.AND, Op.OR) else acc.dtype
            acc = Static(np.asarray(arr), dt)
        return acc
    rank = max(len(t.shape(a)) for a in args)
    acc = _operand(t, args[0], rank, node.input[0])
    for i, nxt in enumerate(args[1:], 1):
        y = _operand(t, nxt, rank, node.input[i])
        if o in (Op.AND, Op.OR):
            acc = t.b.op(o, [t.tensor(acc) if is_node(acc) else t.b.const(acc, "bool"), y if is_node(y) else
                             t.b.const(y, "bool")])
        elif o is Op.DIV and t.dtype(args[0]) not in FLOATS:
            acc = t.b.op(Op.DIV, [acc if is_node(acc) else t.b.const(acc, t.dtype(args[0])),
                                  y if is_node(y) else t.b.const(y, t.dtype(args[0]))])
        else:
            acc = t.b.binary(o, acc, y)
    return acc


@op(*_UN)
def _unary(t, node, args, attrs):
    x = args[0]
    if isinstance(x, Static) and node.op_type in ("Neg", "Not", "Abs"):
        fn = {"Neg": np.negative, "Not": np.logical_not, "Abs": np.abs}[node.op_type]
        return Static(np.asarray(fn(x.array)), x.dtype)
    return t.b.unary(_UN[node.op_type], t.tensor(x, node.input[0]))


@op("LeakyRelu", "Elu", "HardSigmoid", "HardSwish", "Softplus")
def _activation(t, node, args, attrs):
    b, x = t.b, t.tensor(args[0], node.input[0])
    kind = node.op_type
    if kind == "LeakyRelu":
        return b.where(b.compare(Op.GT, x, 0.0), x, b.binary(Op.MUL, x, float(attrs.get("alpha", 0.01))))
    if kind == "Elu":
        alpha = float(attrs.get("alpha", 1.0))
        return b.where(b.compare(Op.GT, x, 0.0), x, b.binary(Op.MUL, b.binary(Op.SUB, b.unary(Op.EXP, x), 1.0), alpha))
    if kind in ("HardSigmoid", "HardSwish"):
        alpha, beta = float(attrs.get("alpha", 0.2 if kind == "HardSigmoid" else 1 / 6)), float(attrs.get("beta", 0.5))
        hs = b.binary(Op.MINIMUM, b.binary(Op.MAXIMUM, b.binary(Op.ADD, b.binary(Op.MUL, x, alpha), beta), 0.0), 1.0)
        return hs if kind == "HardSigmoid" else b.binary(Op.MUL, x, hs)
    return b.unary(Op.LOG, b.binary(Op.ADD, b.unary(Op.EXP, x), 1.0))       # Softplus, as ONNX defines it


@op("Reciprocal")
def _reciprocal(t, node, args, attrs):
    return t.b.binary(Op.DIV, 1.0, t.tensor(args[0], node.input[0]))


@op("IsNaN")
def _isnan(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    return t.b.op(Op.NE, [x, x])


@op("Gelu")
def _gelu(t, node, args, attrs):
    return C.gelu(t.b, t.tensor(args[0], node.input[0]), attrs.get("approximate", "none"))


@op("Pow")
def _pow(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    e = static(args[1], "the exponent of Pow").reshape(-1)
    if e.size != 1:
        raise TranslationError("Pow with a non-scalar exponent")
    e = float(e[0])
    table = {1.0: lambda: x, 2.0: lambda: t.b.binary(Op.MUL, x, x), 0.5: lambda: t.b.unary(Op.SQRT, x),
             -0.5: lambda: t.b.unary(Op.RSQRT, x), -1.0: lambda: t.b.binary(Op.DIV, 1.0, x),
             3.0: lambda: t.b.binary(Op.MUL, t.b.binary(Op.MUL, x, x), x)}
    if e not in table:
        raise TranslationError(f"Pow with exponent {e} (supported: -1, 0.5, -0.5, 1, 2, 3)")
    return table[e]()


@op("Where")
def _where(t, node, args, attrs):
    if all_static(args):
        return Static(np.where(args[0].array, args[1].array, args[2].array), args[1].dtype)
    rank = max(len(t.shape(a)) for a in args)
    cond = t.tensor(args[0], node.input[0])
    return t.b.where(cond, _operand(t, args[1], rank, node.input[1]), _operand(t, args[2], rank, node.input[2]))


@op("Clip")
def _clip(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    if lo is not None:
        x = t.b.binary(Op.MAXIMUM, x, _operand(t, lo, t.b.rank(x), node.input[1]))
    if hi is not None:
        x = t.b.binary(Op.MINIMUM, x, _operand(t, hi, t.b.rank(x), node.input[2]))
    return x


@op("Cast")
def _cast(t, node, args, attrs):
    dt = ONNX_DTYPES.get(attrs["to"])
    if dt is None:
        raise TranslationError(f"Cast to ONNX element type {attrs['to']}")
    x = args[0]
    if isinstance(x, Static):
        if x.symbolic:
            return Static(x.array, dt)
        return Static(x.array.astype(NP_DTYPES.get(dt, np.float32)), dt)
    return t.b.cast(x, dt)


@op("Identity", "Dropout")
def _identity(t, node, args, attrs):
    if node.op_type == "Dropout":
        training = args[2] if len(args) > 2 else None
        if training is not None and bool(static(training, "training_mode").reshape(-1)[0]):
            raise TranslationError("Dropout in training mode")
        if len(node.output) > 1 and node.output[1]:
            raise TranslationError("Dropout's mask output")
    return args[0]


# --- contractions ---------------------------------------------------------------------------------
@op("MatMul")
def _matmul(t, node, args, attrs):
    return C.matmul(t.b, t.tensor(args[0], node.input[0]), t.tensor(args[1], node.input[1]))


@op("Gemm")
def _gemm(t, node, args, attrs):
    a, b = t.tensor(args[0], node.input[0]), t.tensor(args[1], node.input[1])
    if attrs.get("transA", 0):
        a = t.b.transpose(a, 0, 1)
    if attrs.get("transB", 0):
        b = t.b.transpose(b, 0, 1)
    y = C.matmul(t.b, a, b)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = t.b.binary(Op.MUL, y, alpha)
    if len(args) > 2 and args[2] is not None and beta != 0.0:
        c = t.tensor(args[2], node.input[2])
        y = t.b.binary(Op.ADD, y, c if beta == 1.0 else t.b.binary(Op.MUL, c, beta))
    return y


# --- normalisation, softmax -----------------------------------------------------------------------
@op("Softmax", "LogSoftmax")
def _softmax(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    default = -1 if t.opset >= 13 else 1
    axis = int(attrs.get("axis", default))
    if t.opset < 13 and axis % max(t.b.rank(x), 1) != t.b.rank(x) - 1:
        raise TranslationError("Softmax before opset 13 over a non-last axis (it flattens)")
    return C.softmax(t.b, x, axis, node.op_type == "LogSoftmax")


@op("LayerNormalization")
def _layer_norm(t, node, args, attrs):
    if len(node.output) > 1 and any(node.output[1:]):
        raise TranslationError("LayerNormalization's mean / inverse std outputs")
    x = t.tensor(args[0], node.input[0])
    axis = int(attrs.get("axis", -1)) % t.b.rank(x)
    w = t.tensor(args[1], node.input[1]) if len(args) > 1 and args[1] is not None else None
    bias = t.tensor(args[2], node.input[2]) if len(args) > 2 and args[2] is not None else None
    return C.layer_norm(t.b, x, t.b.rank(x) - axis, w, bias, float(attrs.get("epsilon", 1e-5)))


@op("RMSNormalization")
def _rms_norm(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    axis = int(attrs.get("axis", -1)) % t.b.rank(x)
    return C.rms_norm(t.b, x, t.b.rank(x) - axis, t.tensor(args[1], node.input[1]),
                      float(attrs.get("epsilon", 1e-5)))


@op("BatchNormalization")
def _batch_norm(t, node, args, attrs):
    if attrs.get("training_mode", 0) or (len(node.output) > 1 and any(node.output[1:])):
        raise TranslationError("BatchNormalization in training mode")
    x, w, bias, mean, var = (t.tensor(a, n) for a, n in zip(args[:5], node.input[:5]))
    return C.batch_norm(t.b, x, w, bias, mean, var, float(attrs.get("epsilon", 1e-5)))


# --- reductions -----------------------------------------------------------------------------------
_RED = {"ReduceMean": Op.MEAN, "ReduceSum": Op.SUM, "ReduceMax": Op.MAX, "ReduceMin": Op.MIN}


@op(*_RED)
def _reduce(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    axes = attrs.get("axes")
    if len(args) > 1 and args[1] is not None:
        axes = ints(args[1], "the axes of " + node.op_type)
    keep = bool(attrs.get("keepdims", 1))
    if not axes and attrs.get("noop_with_empty_axes", 0):
        return x
    return t.b.reduce(_RED[node.op_type], x, axes or None, keep)


@op("GlobalAveragePool")
def _global_avg(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    if t.b.rank(x) != 4:
        raise TranslationError("GlobalAveragePool of a non-4-D input")
    return C.adaptive_avg_pool2d(t.b, x, (1, 1))


# --- convolution, pooling -------------------------------------------------------------------------
def _pads4(attrs) -> tuple[int, int, int, int]:
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise TranslationError(f"auto_pad={attrs['auto_pad']} (export with explicit pads)")
    p = list(attrs.get("pads", [0, 0, 0, 0]))
    if len(p) != 4:
        raise TranslationError("a non-2-D convolution or pooling")
    return (p[0], p[2], p[1], p[3])            # ONNX: [top, left, bottom, right]


def _conv_pads(attrs, spatial, kernel, stride, dilation) -> list[tuple[int, int]]:
    """(before, after) per spatial dim: ONNX's [x1_begin, x2_begin, ..., x1_end, ...], or what
    auto_pad SAME_UPPER / SAME_LOWER gives for these sizes."""
    n = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        p = list(attrs.get("pads", [0] * 2 * n)) if auto == "NOTSET" else [0] * 2 * n
        return [(int(p[i]), int(p[i + n])) for i in range(n)]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise TranslationError(f"auto_pad={auto}")
    pairs = []
    for size, k, s, d in zip(spatial, kernel, stride, dilation):
        if not isinstance(size, int):
            raise TranslationError(f"auto_pad={auto} over a symbolic size ({size})")
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        pairs.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return pairs


@op("Conv")
def _conv(t, node, args, attrs):
    """1, 2 or 3 spatial dims, groups, dilations, explicit pads or auto_pad SAME_UPPER / SAME_LOWER."""
    x, w = t.tensor(args[0], node.input[0]), t.tensor(args[1], node.input[1])
    bias = t.tensor(args[2], node.input[2]) if len(args) > 2 and args[2] is not None else None
    n = t.b.rank(w) - 2
    if n not in (1, 2, 3) or t.b.rank(x) != n + 2:
        raise TranslationError(f"Conv of a rank-{t.b.rank(x)} input with a rank-{t.b.rank(w)} kernel "
                               "(1, 2 or 3 spatial dims)")
    kernel = t.b.shape(w)[2:]
    stride = tuple(int(v) for v in attrs.get("strides", (1,) * n))
    dilation = tuple(int(v) for v in attrs.get("dilations", (1,) * n))
    pads = _conv_pads(attrs, t.b.shape(x)[2:], kernel, stride, dilation)
    return C.conv(t.b, x, w, bias, stride, pads, dilation, int(attrs.get("group", 1)))


@op("CumSum")
def _cumsum(t, node, args, attrs):
    """Exclusive and reverse too, exact for integers: a masked row reduction."""
    x = args[0]
    axis = int(static(args[1], "the axis of CumSum").reshape(-1)[0])
    exclusive, reverse = bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0))
    if isinstance(x, Static) and not x.symbolic and not exclusive and not reverse:
        return Static(np.cumsum(x.array, axis=axis).astype(x.array.dtype), x.dtype)
    x = t.tensor(x, node.input[0])
    return C.cumsum(t.b, x, axis % t.b.rank(x), exclusive=exclusive, reverse=reverse)


@op("MaxPool", "AveragePool")
def _pool(t, node, args, attrs):
    if len(node.output) > 1 and node.output[1]:
        raise TranslationError("MaxPool's indices output")
    k = tuple(attrs["kernel_shape"])
    if len(k) != 2:
        raise TranslationError("a non-2-D pooling")
    kind = "max" if node.op_type == "MaxPool" else "avg"
    return C.pool2d(t.b, t.tensor(args[0], node.input[0]), kind, k, tuple(attrs.get("strides", (1, 1))),
                    _pads4(attrs), tuple(attrs.get("dilations", (1, 1))), bool(attrs.get("ceil_mode", 0)),
                    bool(attrs.get("count_include_pad", 0)))

