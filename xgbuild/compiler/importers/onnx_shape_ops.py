"""The ONNX shape and source ops: reshapes, slices, gathers, concatenation, constants.

Registered into `onnx_table.TABLE`. On static values (sizes, initializers) they fold at import,
symbolic dims included as sympy expressions; on graph tensors they emit IR views and copies.
"""

from __future__ import annotations

import math

import numpy as np
import sympy

from ..ir.graph import Op
from . import composites as C
from .builder import TranslationError
from .onnx_values import ONNX_DTYPES, Static, ir_dim
from .onnx_table import all_static, ints, op, static

# --- shapes ---------------------------------------------------------------------------------------
@op("Shape")
def _shape(t, node, args, attrs):
    dims = list(t.shape(args[0]))
    dims = dims[attrs.get("start", 0):attrs.get("end", len(dims))] if "end" in attrs else dims[attrs.get("start", 0):]
    vals = [sympy.Symbol(d) if isinstance(d, str) and "*" not in d else (sympy.sympify(d) if isinstance(d, str)
                                                                          else int(d)) for d in dims]
    symbolic = any(isinstance(v, sympy.Basic) for v in vals)
    return Static(np.array(vals, dtype=object if symbolic else np.int64), "int64")


def _target_shape(t, x, shape: list, allowzero: bool) -> tuple:
    in_shape = [sympy.sympify(d) if isinstance(d, str) else int(d) for d in t.shape(x)]
    out = []
    for i, d in enumerate(shape):
        if _is_zero(d) and not allowzero:
            out.append(in_shape[i])
        else:
            out.append(d)
    if any(_is_minus_one(d) for d in out):
        known = math.prod(d for d in out if not _is_minus_one(d))
        total = math.prod(in_shape) if in_shape else 1
        out = [sympy.simplify(sympy.sympify(total) / sympy.sympify(known)) if _is_minus_one(d) else d for d in out]
    return tuple(ir_dim(sympy.sympify(d)) for d in out)


def _is_zero(d) -> bool:
    return not isinstance(d, sympy.Basic) and int(d) == 0 or (isinstance(d, sympy.Basic) and d == 0)


def _is_minus_one(d) -> bool:
    return (isinstance(d, sympy.Basic) and d == -1) or (not isinstance(d, sympy.Basic) and int(d) == -1)


@op("Reshape")
def _reshape(t, node, args, attrs):
    shape = ints(args[1], "the shape of Reshape")
    x = args[0]
    if isinstance(x, Static) and not x.symbolic:
        return Static(x.array.reshape([int(d) for d in shape]), x.dtype)
    x = t.tensor(x, node.input[0])
    return t.b.reshape(x, _target_shape(t, x, shape, bool(attrs.get("allowzero", 0))))


@op("Flatten")
def _flatten(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    axis = int(attrs.get("axis", 1)) % (t.b.rank(x) + 1)
    shape = [sympy.sympify(d) if isinstance(d, str) else d for d in t.b.shape(x)]
    out = (math.prod(shape[:axis]) if axis else 1, math.prod(shape[axis:]))
    return t.b.reshape(x, tuple(ir_dim(sympy.sympify(d)) for d in out))


@op("Transpose")
def _transpose(t, node, args, attrs):
    x = args[0]
    perm = attrs.get("perm")
    if isinstance(x, Static):
        return Static(np.transpose(x.array, perm), x.dtype)
    perm = list(perm) if perm is not None else list(range(t.b.rank(x)))[::-1]
    return t.b.permute(x, perm)


def _axes(t, node, args, attrs) -> list[int]:
    if len(args) > 1 and args[1] is not None:
        return [int(a) for a in ints(args[1], f"the axes of {node.op_type}")]
    return list(attrs.get("axes", []))


@op("Unsqueeze")
def _unsqueeze(t, node, args, attrs):
    x = args[0]
    axes = _axes(t, node, args, attrs)
    rank = len(t.shape(x)) + len(axes)
    axes = sorted(a % rank for a in axes)
    if isinstance(x, Static):
        arr = x.array
        for a in axes:
            arr = np.expand_dims(arr, a)
        return Static(arr, x.dtype)
    shape = list(t.b.shape(x))
    for a in axes:
        shape.insert(a, 1)
    return t.b.reshape(x, tuple(shape))


@op("Squeeze")
def _squeeze(t, node, args, attrs):
    x = args[0]
    shape = list(t.shape(x))
    axes = _axes(t, node, args, attrs)
    axes = {a % len(shape) for a in axes} if axes else {i for i, d in enumerate(shape) if d == 1}
    if isinstance(x, Static):
        return Static(np.squeeze(x.array, tuple(sorted(axes))), x.dtype)
    return t.b.reshape(x, tuple(d for i, d in enumerate(shape) if i not in axes))


@op("Concat")
def _concat(t, node, args, attrs):
    axis = int(attrs["axis"])
    xs = [a for a in args if a is not None]
    if all_static(xs):
        symbolic = any(x.symbolic for x in xs)
        arr = np.concatenate([x.array.astype(object) if symbolic else x.array for x in xs], axis=axis)
        return Static(arr, xs[0].dtype)
    return C.cat(t.b, [t.tensor(x, n) for x, n in zip(xs, node.input)], axis)


@op("Split")
def _split(t, node, args, attrs):
    x = args[0]
    axis = int(attrs.get("axis", 0))
    size = t.shape(x)[axis]
    if len(args) > 1 and args[1] is not None:
        sizes = [int(s) for s in ints(args[1], "the sizes of Split")]
    elif "split" in attrs:
        sizes = list(attrs["split"])
    else:
        n = int(attrs.get("num_outputs", len(node.output)))
        if not isinstance(size, int):
            raise TranslationError("splitting a symbolic dim")
        chunk = -(-size // n)
        sizes = [min(chunk, size - i * chunk) for i in range(n)]
    if isinstance(x, Static):
        return tuple(Static(a, x.dtype) for a in np.split(x.array, np.cumsum(sizes)[:-1], axis=axis))
    x = t.tensor(x, node.input[0])
    outs, start = [], 0
    for s in sizes:
        outs.append(t.b.slice(x, axis, start, start + s))
        start += s
    return tuple(outs)


@op("Slice")
def _slice(t, node, args, attrs):
    x = args[0]
    starts, ends = ints(args[1], "the starts of Slice"), ints(args[2], "the ends of Slice")
    rank = len(t.shape(x))
    axes = ints(args[3], "the axes of Slice") if len(args) > 3 and args[3] is not None else list(range(len(starts)))
    steps = ints(args[4], "the steps of Slice") if len(args) > 4 and args[4] is not None else [1] * len(starts)
    big = 2**62
    if isinstance(x, Static):
        index = [slice(None)] * rank
        for s, e, a, st in zip(starts, ends, axes, steps):
            index[int(a) % rank] = slice(int(s), None if abs(int(e)) >= big else int(e), int(st))
        return Static(x.array[tuple(index)], x.dtype)
    x = t.tensor(x, node.input[0])
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) % rank
        size = t.b.shape(x)[a]
        e = None if abs(int(e)) >= big or (isinstance(size, int) and int(e) >= size) else int(e)
        x = t.b.slice(x, a, int(s), e, int(st))
    return x


@op("Gather")
def _gather(t, node, args, attrs):
    data, idx = args[0], args[1]
    axis = int(attrs.get("axis", 0))
    if all_static([data, idx]):
        return Static(np.take(data.array, idx.array.astype(np.int64), axis=axis), data.dtype)
    if isinstance(idx, Static):
        indices = idx.array.astype(np.int64)
        x = t.tensor(data, node.input[0])
        if indices.ndim == 0:
            return t.b.select(x, axis, int(indices))
        flat = indices.reshape(-1)
        if indices.ndim == 1 and len(flat) and (np.diff(flat) == 1).all() and flat[0] >= 0:
            return t.b.slice(x, axis, int(flat[0]), int(flat[-1]) + 1)
        raise TranslationError("Gather of a tensor at constant indices that are not a contiguous range")
    if axis != 0:
        raise TranslationError("Gather of run-time indices along an axis other than 0")
    table = t.tensor(data, node.input[0])
    rows = t.b.shape(table)[0]
    n = t.b.node(idx)
    if n.op is Op.INPUT and n.attr("name") in t.inputs and isinstance(rows, int):
        lo, hi = t.ranges.get(n.attr("name"), (-rows, rows))
        t.ranges[n.attr("name")] = (max(lo, -rows), min(hi, rows))
    if n.op is not Op.IOTA and isinstance(rows, int):
        # ONNX counts negative indices from the end: -1 is the last row.
        idx = t.b.where(t.b.compare(Op.LT, idx, 0), t.b.binary(Op.ADD, idx, rows), idx)
    return C.embedding(t.b, table, idx)


@op("Expand")
def _expand(t, node, args, attrs):
    x, shape = args[0], ints(args[1], "the shape of Expand")
    xs = list(t.shape(x))
    rank = max(len(xs), len(shape))
    xs = [1] * (rank - len(xs)) + xs
    shape = [1] * (rank - len(shape)) + shape
    out = [s if (isinstance(s, sympy.Basic) or int(s) != 1) else d for d, s in zip(xs, shape)]
    if isinstance(x, Static) and not any(isinstance(d, sympy.Basic) and not d.is_Integer for d in out):
        return Static(np.broadcast_to(x.array, [int(d) for d in out]).copy(), x.dtype)
    return t.b.expand(t.tensor(x, node.input[0]), tuple(ir_dim(sympy.sympify(d)) for d in out))


# --- sources --------------------------------------------------------------------------------------
@op("Constant")
def _constant(t, node, args, attrs):
    from onnx import numpy_helper
    if "value" in attrs:
        arr = numpy_helper.to_array(attrs["value"])
        return Static(arr, ONNX_DTYPES.get(attrs["value"].data_type, "float32"))
    for key, dt in (("value_float", "float32"), ("value_int", "int64"), ("value_floats", "float32"),
                    ("value_ints", "int64")):
        if key in attrs:
            return Static(np.array(attrs[key], dtype=np.float32 if dt == "float32" else np.int64), dt)
    raise TranslationError(f"Constant with {', '.join(attrs)}")


@op("ConstantOfShape")
def _constant_of_shape(t, node, args, attrs):
    from onnx import numpy_helper
    shape = ints(args[0], "the shape of ConstantOfShape")
    value = numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
    dt = ONNX_DTYPES.get(attrs["value"].data_type, "float32") if "value" in attrs else "float32"
    if any(isinstance(d, sympy.Basic) for d in shape):
        return t.b.full(value.reshape(-1)[0].item(), dt, tuple(ir_dim(sympy.sympify(d)) for d in shape))
    return Static(np.full([int(d) for d in shape], value.reshape(-1)[0], dtype=value.dtype), dt)


@op("Range")
def _range(t, node, args, attrs):
    start, limit, delta = (static(a, "an argument of Range").reshape(-1)[0] for a in args)
    return Static(np.arange(start, limit, delta), args[0].dtype)


@op("Trilu")
def _trilu(t, node, args, attrs):
    x = static(args[0], "the input of Trilu")
    k = int(static(args[1], "k").reshape(-1)[0]) if len(args) > 1 and args[1] is not None else 0
    arr = np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)
    return Static(arr, args[0].dtype)

