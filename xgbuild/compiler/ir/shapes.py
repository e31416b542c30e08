"""Shape and dtype rules of every IR op, for symbolic and concrete dims alike.

`infer` recomputes a node's dtype and shape from its inputs. The verifier uses it to check that
a pass left the graph consistent; shape specialisation uses it to check concrete sizes at first
run (a `K` of 64 against a `K` of 32 is caught there, naming the op and its source line).
"""

from __future__ import annotations

from typing import Any

from .graph import BINARY, COLLECTIVE, COMPARE, REDUCE, UNARY, Dim, Node, Op, Shape

FLOATS = {"float16", "bfloat16", "float32", "float64"}
INTEGERS = {"int8", "int16", "int32", "int64", "uint8"}


class ShapeError(ValueError):
    pass


def broadcast(a: Shape, b: Shape) -> Shape:
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"shapes {list(a)} and {list(b)} do not broadcast ({x} vs {y})")
    return tuple(reversed(out))


def _norm_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= d < r:
        raise ShapeError(f"dimension {d} out of range for rank {rank}")
    return d % r


def numel(shape: Shape) -> int | None:
    total = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        total *= d
    return total


def infer(node: Node, ins: list[tuple[str, Shape]]) -> tuple[str, Shape]:
    """The (dtype, shape) `node` must have given its inputs' (dtype, shape)."""
    op = node.op
    if op in (Op.INPUT, Op.PARAM, Op.CONST, Op.FULL, Op.RANDN, Op.RAND, Op.IOTA, Op.CALL, Op.PROJ, Op.EXTERN):
        return node.dtype, node.shape
    if op in UNARY:
        dtype = node.dtype if op is Op.CAST else ins[0][0]
        return dtype, ins[0][1]
    if op in BINARY:
        (da, sa), (db, sb) = ins
        if da != db:
            raise ShapeError(f"`{op.value}` of {da} and {db}")
        shape = broadcast(sa, sb)
        return ("bool" if op in COMPARE else da), shape
    if op is Op.WHERE:
        (dc, sc), (da, sa), (db, sb) = ins
        if dc != "bool" or da != db:
            raise ShapeError(f"`where` needs a bool condition and equal dtypes, got {dc}, {da}, {db}")
        return da, broadcast(sc, broadcast(sa, sb))
    if op is Op.MATMUL:
        (da, a), (db, b) = ins
        if da != db or not a or not b:
            raise ShapeError(f"`matmul` of {da}{list(a)} and {db}{list(b)}")
        ka, kb = a[-1], (b[-2] if len(b) >= 2 else b[0])
        if ka != kb:
            raise ShapeError(f"matmul inner dimensions differ: {list(a)} @ {list(b)} ({ka} vs {kb})")
        batch = broadcast(a[:-2], b[:-2]) if (len(a) > 2 or len(b) > 2) else ()
        return da, batch + (a[-2:-1] if len(a) >= 2 else ()) + (b[-1:] if len(b) >= 2 else ())
    if op in REDUCE:
        dtype, shape = ins[0]
        dim, keep = node.attr("dim"), node.attr("keepdim", False)
        if dim is None:
            return dtype, tuple(1 for _ in shape) if keep else ()
        if not shape:
            return dtype, shape
        d = _norm_dim(dim, len(shape))
        return dtype, tuple((1 if i == d else s) for i, s in enumerate(shape) if keep or i != d)
    if op in (Op.SOFTMAX, Op.LOG_SOFTMAX) or op in COLLECTIVE:
        if op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
            _norm_dim(node.attr("dim", -1), len(ins[0][1]))
        return ins[0]
    if op is Op.TRANSPOSE:
        dtype, shape = ins[0]
        d0, d1 = _norm_dim(node.attr("dim0"), len(shape)), _norm_dim(node.attr("dim1"), len(shape))
        s = list(shape)
        s[d0], s[d1] = s[d1], s[d0]
        return dtype, tuple(s)
    if op is Op.RESHAPE:
        before, after = numel(ins[0][1]), numel(node.shape)
        if before is not None and after is not None and before != after:
            raise ShapeError(f"cannot reshape {list(ins[0][1])} ({before} elements) into {list(node.shape)}")
        return ins[0][0], node.shape
    if op is Op.INDEX:
        return ins[0][0], index_shape(ins[0][1], node.attr("items"))
    if op is Op.UNINDEX:
        expected = index_shape(node.shape, node.attr("items"))
        if tuple(expected) != tuple(ins[0][1]):
            raise ShapeError(f"`unindex` of {list(ins[0][1])} into {list(node.shape)} needs {list(expected)}")
        return ins[0][0], node.shape
    if op is Op.GATHER:
        (dtype, table), (idx_dtype, idx) = ins
        if not table:
            raise ShapeError("`gather` needs a table of rank 1 or more, got a scalar")
        if idx_dtype not in INTEGERS:
            raise ShapeError(f"`gather` indices must be integers, got {idx_dtype}")
        return dtype, tuple(idx) + tuple(table[1:])
    raise ShapeError(f"unknown op {op}")


def index_shape(shape: Shape, items: Any) -> Shape:
    out: list[Dim] = []
    for axis, item in enumerate(items):
        kind = item[0]
        size = shape[axis]
        if kind == "i":             # ("i", constant index)
            if isinstance(size, int) and not -size <= item[1] < size:
                raise ShapeError(f"index {item[1]} out of bounds for dimension {axis} of size {size}")
        elif kind == "d":           # ("d", input position): a run-time index
            pass
        else:                       # ("s", lo, hi, step)
            _, lo, hi, step = item
            if isinstance(size, int):
                out.append(len(range(size)[slice(lo, hi, step)]))
            elif lo is None and hi is None and step in (None, 1):
                out.append(size)
            else:
                out.append(f"{size}[{'' if lo is None else lo}:{'' if hi is None else hi}:{'' if step is None else step}]")
    out.extend(shape[len(items):])
    return tuple(out)
