"""The ONNX shape, indexing and source ops: reshapes, slices, gathers (Gather, GatherND,
GatherElements: GATHER kernels), concatenation, padding, constants.

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
from ..ir.shapes import FLOATS
from .onnx_values import NP_DTYPES, ONNX_DTYPES, Static, ir_dim, sym
from .onnx_table import all_static, ints, op, static

# --- shapes ---------------------------------------------------------------------------------------
@op("Shape")
def _shape(t, node, args, attrs):
    dims = list(t.shape(args[0]))
    dims = dims[attrs.get("start", 0):attrs.get("end", len(dims))] if "end" in attrs else dims[attrs.get("start", 0):]
    vals = [sym(d) if isinstance(d, str) else int(d) for d in dims]
    symbolic = any(isinstance(v, sympy.Basic) for v in vals)
    return Static(np.array(vals, dtype=object if symbolic else np.int64), "int64")


def _target_shape(t, x, shape: list, allowzero: bool) -> tuple:
    in_shape = [sym(d) if isinstance(d, str) else int(d) for d in t.shape(x)]
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
    if isinstance(x, Static) and not any(isinstance(d, sympy.Basic) and not d.is_Integer for d in shape):
        # shape values (symbolic or not) reshaped: numpy resolves -1; 0 copies the input's size
        dims = [x.array.shape[i] if int(d) == 0 and not attrs.get("allowzero", 0) else int(d)
                for i, d in enumerate(shape)]
        return Static(x.array.reshape(dims), x.dtype)
    x = t.tensor(x, node.input[0])
    return t.b.reshape(x, _target_shape(t, x, shape, bool(attrs.get("allowzero", 0))))


@op("Flatten")
def _flatten(t, node, args, attrs):
    x = t.tensor(args[0], node.input[0])
    axis = int(attrs.get("axis", 1)) % (t.b.rank(x) + 1)
    shape = [sym(d) if isinstance(d, str) else d for d in t.b.shape(x)]
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
    if isinstance(x, Static) and not any(_is_sym(v) for v in starts + ends):
        index = [slice(None)] * rank
        for s, e, a, st in zip(starts, ends, axes, steps):
            index[int(a) % rank] = slice(int(s), None if abs(int(e)) >= _BIG else int(e), int(st))
        return Static(x.array[tuple(index)], x.dtype)
    x = t.tensor(x, node.input[0])
    for s, e, a, st in zip(starts, ends, axes, steps):
        x = _slice_dim(t, x, int(a) % rank, s, e, int(st))
    return x


_BIG = 2**62            # exporters write "to the end" as INT64_MAX (or MIN, stepping backwards)


def _slice_dim(t, x, axis: int, start, end, step: int):
    """x[start:end:step] along `axis`, ONNX's clamping included. Concrete bounds on a concrete
    size are an INDEX view; a symbolic length (`table[:seq]`, a static table cut to a dynamic
    sequence length) is a GATHER of the rows at `start + arange(n)`. A symbolic end past a
    concrete size is taken as within it (ONNX would clamp it; exporters write the length the
    model uses)."""
    size = t.b.shape(x)[axis]
    if not any(_is_sym(v) for v in (start, end)) and isinstance(size, int):
        e = None if abs(int(end)) >= _BIG or int(end) >= size else int(end)
        return t.b.slice(x, axis, int(start), e, step)
    if not any(_is_sym(v) for v in (start, end)) and 0 <= int(start) and 0 <= int(end) < _BIG and step > 0:
        return t.b.slice(x, axis, int(start), int(end), step)   # a constant window of a symbolic dim
    n_size = sym(size)

    def bound(v):
        if _is_sym(v):
            return sympy.sympify(v)
        v = int(v)
        if v >= _BIG:
            return n_size
        return n_size + v if v < 0 else sympy.Integer(v)
    lo, hi = bound(start), bound(end)
    if step != 1:
        raise TranslationError(f"Slice with step {step} and a symbolic bound ({start}:{end}) along dim {axis}")
    if lo == 0 and sympy.simplify(hi - n_size) == 0:
        return x
    return C.slice_dyn(t.b, x, axis, ir_dim(lo), ir_dim(hi))


@op("Gather")
def _gather(t, node, args, attrs):
    """Folded on static values; a scalar or contiguous constant index is a view; otherwise a
    GATHER along the axis (negative indices count from the end; index inputs get a range check)."""
    data, idx = args[0], args[1]
    axis = int(attrs.get("axis", 0)) % len(t.shape(data))
    if all_static([data, idx]):
        return Static(np.take(data.array, idx.array.astype(np.int64), axis=axis), data.dtype)
    x = t.tensor(data, node.input[0])
    size = t.b.shape(x)[axis]
    if isinstance(idx, Static) and not idx.symbolic:
        indices = idx.array.astype(np.int64)
        if isinstance(size, int):
            indices = np.where(indices < 0, indices + size, indices)
        if indices.ndim == 0:
            return t.b.select(x, axis, int(indices))
        flat = indices.reshape(-1)
        if indices.ndim == 1 and len(flat) and (np.diff(flat) == 1).all() and flat[0] >= 0:
            return t.b.slice(x, axis, int(flat[0]), int(flat[-1]) + 1)
        return C.take(t.b, x, axis, t.tensor(Static(indices, "int64"), node.input[1]))
    idx = t.tensor(idx, node.input[1])
    n = t.b.node(idx)
    if n.op is Op.INPUT and n.attr("name") in t.inputs and isinstance(size, int):
        lo, hi = t.ranges.get(n.attr("name"), (-size, size))
        t.ranges[n.attr("name")] = (max(lo, -size), min(hi, size))
    if n.op is Op.IOTA and axis == 0 and isinstance(n.shape[0], int):
        return C.embedding(t.b, x, idx)                 # rows 0..n: a slice
    return C.take(t.b, x, axis, idx)                    # negative indices count from the end


@op("GatherND")
def _gather_nd(t, node, args, attrs):
    """data[idx[..., 0], idx[..., 1], ...]: the index tuple's components as torch-style advanced
    indices (a GATHER kernel, never a selection matmul)."""
    if int(attrs.get("batch_dims", 0)):
        raise TranslationError(f"GatherND with batch_dims={attrs['batch_dims']} (0 is supported)")
    x = t.tensor(args[0], node.input[0])
    idx = t.tensor(args[1], node.input[1])
    k = t.b.shape(idx)[-1]
    if not isinstance(k, int) or k > t.b.rank(x):
        raise TranslationError(f"GatherND with index tuples of length {k} into a rank-{t.b.rank(x)} tensor")
    return C.advanced_index(t.b, x, [t.b.select(idx, -1, i) for i in range(k)])


@op("GatherElements")
def _gather_elements(t, node, args, attrs):
    """torch.gather semantics: one GATHER of the flattened data at row * n + index."""
    x = t.tensor(args[0], node.input[0])
    axis = int(attrs.get("axis", 0)) % t.b.rank(x)
    return C.gather_elements(t.b, x, axis, t.tensor(args[1], node.input[1]))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


@op("Pad")
def _pad(t, node, args, attrs):
    """Modes constant (any value), reflect and edge, pads per axis (negative: a crop): UNINDEX
    placements and index views, never a matmul."""
    mode = attrs.get("mode", "constant")
    if mode not in _PAD_MODES:
        raise TranslationError(f"Pad in mode {mode!r} (supported: {', '.join(_PAD_MODES)})")
    x = args[0]
    rank = len(t.shape(x))
    pads = [int(p) for p in (ints(args[1], "the pads of Pad") if len(args) > 1 else attrs["pads"])]
    axes = [int(a) % rank for a in ints(args[3], "the axes of Pad")] if len(args) > 3 and args[3] is not None \
        else list(range(rank))
    value = 0.0
    if len(args) > 2 and args[2] is not None:
        value = static(args[2], "the value of Pad").reshape(-1)[0].item()
    elif "value" in attrs:
        value = float(attrs["value"])
    pairs = [(0, 0)] * rank
    for i, a in enumerate(axes):
        pairs[a] = (pads[i], pads[i + len(axes)])
    if not any(b or e for b, e in pairs):
        return x
    return C.pad(t.b, t.tensor(x, node.input[0]), pairs, value, _PAD_MODES[mode])


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
    """Static when its arguments are numbers; a run-time IOTA (scaled, shifted) when the limit
    or start is a size: `arange(seq)` under a dynamic sequence length."""
    start, limit, delta = (static(a, "an argument of Range").reshape(-1)[0] for a in args)
    dt = args[0].dtype
    if not any(_is_sym(v) for v in (start, limit, delta)):
        conv = float if dt in FLOATS else int
        return Static(np.arange(conv(start), conv(limit), conv(delta)).astype(NP_DTYPES.get(dt, np.float32)), dt)
    if _is_sym(delta) or dt in FLOATS or int(delta) == 0:
        raise TranslationError(f"Range with a symbolic size and a step {delta} of {dt} (an integer step is supported)")
    step = int(delta)
    span = sympy.sympify(limit - start) if step > 0 else sympy.sympify(start - limit)
    n = span if abs(step) == 1 else sympy.floor((span + abs(step) - 1) / abs(step))
    y = t.b.iota(ir_dim(n), dt)
    if step != 1:
        y = t.b.binary(Op.MUL, y, step)
    if start != 0:
        y = t.b.binary(Op.ADD, y, t.tensor(Static(np.asarray(start, dtype=object), dt)) if _is_sym(start)
                       else int(start))
    return y


def _is_sym(v) -> bool:
    return isinstance(v, sympy.Basic) and not v.is_Number


@op("Trilu")
def _trilu(t, node, args, attrs):
    x = static(args[0], "the input of Trilu")
    k = int(static(args[1], "k").reshape(-1)[0]) if len(args) > 1 and args[1] is not None else 0
    arr = np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)
    return Static(arr, args[0].dtype)

