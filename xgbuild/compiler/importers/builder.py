"""The IR builder importers share: typed node helpers whose dtype and shape come from the IR's rules.

`IRBuilder.op(Op.ADD, [a, b])` infers the result's dtype and shape with `ir.shapes.infer`, so an
importer cannot record a shape the verifier would reject. Scalars become CONST nodes of the dtype
they meet; mixed dtypes are promoted explicitly with CAST (the IR itself never converts). The
neural-network building blocks made of these ops live in `composites.py`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..ir.graph import COMPARE, Dim, Graph, GraphBuilder, Node, Op, Shape, attrs_of
from ..ir.shapes import FLOATS, ShapeError, infer

INTS = {"int8", "int16", "int32", "int64", "uint8"}
_RANK = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]

class TranslationError(ValueError):
    """An op (or a use of one) that the importer cannot express in the IR: the reason, reported
    with the op and where the model uses it."""


class Table(dict):
    """An importer's translations by op name; `@table.op(*names)` registers one under each name."""

    def op(self, *names: str) -> Callable:
        def register(fn: Callable) -> Callable:
            for name in names:
                self[name] = fn
            return fn
        return register


class Ref(int):
    """An IR node id, typed so that a node id is never mistaken for a Python integer scalar."""


def is_node(v: Any) -> bool:
    return isinstance(v, Ref)


_DTYPE_NAMES = set(_RANK)


def xg_dtype(dtype: Any) -> str | None:
    """The XG name of a torch dtype (`torch.float32` -> "float32"), None when XG has none."""
    name = str(dtype).rsplit(".", 1)[-1]
    return name if name in _DTYPE_NAMES else None


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return max(a, b, key=_RANK.index)


class IRBuilder:
    def __init__(self, name: str) -> None:
        self.b = GraphBuilder(name)
        self.src: tuple | None = None           # the source position new nodes carry

    # --- nodes ----------------------------------------------------------------------------------
    def node(self, ref: Ref):
        return self.b.node(ref)

    def dtype(self, ref: Ref) -> str:
        return self.b.node(ref).dtype

    def shape(self, ref: Ref) -> Shape:
        return tuple(self.b.node(ref).shape)

    def rank(self, ref: Ref) -> int:
        return len(self.b.node(ref).shape)

    def add(self, op: Op, inputs: Sequence[Ref], dtype: str, shape: Shape, **attrs: Any) -> Ref:
        return Ref(self.b.add(op, inputs, dtype, tuple(shape), attrs_of(**attrs), self.src))

    def op(self, op: Op, inputs: Sequence[Ref], *, dtype: str | None = None, shape: Shape = (), **attrs: Any) -> Ref:
        """A node whose dtype and shape the IR's rules infer from its inputs."""
        ins = [(self.dtype(i), self.shape(i)) for i in inputs]
        probe = Node(-1, op, tuple(inputs), dtype or (ins[0][0] if ins else "float32"), tuple(shape), attrs_of(**attrs))
        try:
            dt, sh = infer(probe, ins)
        except ShapeError as exc:
            raise TranslationError(f"`{op.value}`: {exc}") from None
        return self.add(op, inputs, dt, sh, **attrs)

    def input(self, name: str, dtype: str, shape: Shape) -> Ref:
        ref = self.add(Op.INPUT, (), dtype, shape, name=name)
        self.b.inputs.append((name, int(ref)))
        return ref

    def const(self, value: Any, dtype: str) -> Ref:
        if dtype in FLOATS:
            value = float(value)
        elif dtype == "bool":
            value = bool(value)
        else:
            value = int(value)
        return self.add(Op.CONST, (), dtype, (), value=value)

    def full(self, value: Any, dtype: str, shape: Shape) -> Ref:
        value = float(value) if dtype in FLOATS else (bool(value) if dtype == "bool" else int(value))
        return self.add(Op.FULL, (), dtype, shape, value=value)

    def iota(self, n: Dim, dtype: str = "int64") -> Ref:
        return self.add(Op.IOTA, (), dtype, (n,))

    def build(self, output: dict) -> Graph:
        return self.b.build(output)

    # --- element-wise -----------------------------------------------------------------------------
    def cast(self, x: Ref, dtype: str) -> Ref:
        return x if self.dtype(x) == dtype else self.add(Op.CAST, [x], dtype, self.shape(x))

    def unary(self, op: Op, x: Ref) -> Ref:
        if op not in (Op.NEG, Op.ABS, Op.NOT, Op.RELU) and self.dtype(x) not in FLOATS:
            x = self.cast(x, "float32")         # torch computes exp/log/… of integers in float32
        return self.op(op, [x])

    def binary(self, op: Op, a: Ref | float | int | bool, b: Ref | float | int | bool,
               dtype: str | None = None) -> Ref:
        """`a op b` with torch's promotion: a scalar takes the tensor's dtype unless it is a float
        meeting an integer tensor; two tensors meet at the wider dtype (or `dtype`, when given)."""
        if not is_node(a) and not is_node(b):
            raise TranslationError(f"`{op.value}` of two scalars reached the IR")
        if dtype is None:
            dtype = self._common(a, b)
        if op is Op.DIV and dtype not in FLOATS:
            dtype = "float32"                   # torch's `/` is true division
        x = self.cast(a, dtype) if is_node(a) else self.const(a, dtype)
        y = self.cast(b, dtype) if is_node(b) else self.const(b, dtype)
        return self.op(op, [x, y])

    def _common(self, a: Any, b: Any) -> str:
        dts = [self.dtype(v) for v in (a, b) if is_node(v)]
        dt = dts[0] if len(dts) == 1 else promote(*dts)
        scalar = a if not is_node(a) else (b if not is_node(b) else None)
        if isinstance(scalar, float) and not isinstance(scalar, bool) and dt not in FLOATS:
            return "float32"
        if isinstance(scalar, int) and not isinstance(scalar, bool) and dt == "bool":
            return "int64"
        return dt

    def compare(self, op: Op, a: Any, b: Any) -> Ref:
        if op not in COMPARE:
            raise ValueError(f"internal: {op} is not a comparison")
        return self.binary(op, a, b)

    def where(self, cond: Ref, a: Any, b: Any) -> Ref:
        dts = [self.dtype(v) for v in (a, b) if is_node(v)]
        dt = (dts[0] if len(dts) == 1 else promote(*dts)) if dts else "float32"
        x = self.cast(a, dt) if is_node(a) else self.const(a, dt)
        y = self.cast(b, dt) if is_node(b) else self.const(b, dt)
        if self.dtype(cond) != "bool":
            cond = self.op(Op.NE, [cond, self.const(0, self.dtype(cond))])
        return self.op(Op.WHERE, [cond, x, y])

    # --- shapes ----------------------------------------------------------------------------------
    def reshape(self, x: Ref, shape: Shape) -> Ref:
        shape = tuple(shape)
        if shape == self.shape(x):
            return x
        return self.op(Op.RESHAPE, [x], shape=shape)

    def transpose(self, x: Ref, d0: int, d1: int) -> Ref:
        r = self.rank(x)
        d0, d1 = d0 % r, d1 % r
        if d0 == d1:
            return x
        return self.op(Op.TRANSPOSE, [x], dim0=d0, dim1=d1)

    def permute(self, x: Ref, perm: Sequence[int]) -> Ref:
        """A permutation as a chain of transposes (views): place each output dim in turn."""
        r = self.rank(x)
        perm = [p % r for p in perm]
        if sorted(perm) != list(range(r)):
            raise TranslationError(f"`permute` by {perm} of a rank-{r} tensor")
        current = list(range(r))
        for i, want in enumerate(perm):
            j = current.index(want)
            if j != i:
                x = self.transpose(x, i, j)
                current[i], current[j] = current[j], current[i]
        return x

    def unsqueeze(self, x: Ref, dim: int) -> Ref:
        s = list(self.shape(x))
        dim = dim % (len(s) + 1)
        return self.reshape(x, tuple(s[:dim] + [1] + s[dim:]))

    def expand(self, x: Ref, shape: Shape) -> Ref:
        """`x` broadcast to `shape` as a real tensor (the IR has no stride-0 views): x + zeros."""
        shape = tuple(shape)
        s = self.shape(x)
        if len(s) < len(shape):
            x = self.reshape(x, (1,) * (len(shape) - len(s)) + s)
        if self.shape(x) == shape:
            return x
        dt = self.dtype(x)
        zeros = self.full(False if dt == "bool" else 0, dt, shape)
        return self.op(Op.OR if dt == "bool" else Op.ADD, [x, zeros])

    def index(self, x: Ref, items: Sequence[tuple]) -> Ref:
        return self.op(Op.INDEX, [x], items=tuple(tuple(i) for i in items))

    def slice(self, x: Ref, dim: int, start: int | None, stop: int | None, step: int = 1) -> Ref:
        r = self.rank(x)
        dim %= r
        size = self.shape(x)[dim]
        if start in (None, 0) and step == 1 and (stop is None or (isinstance(size, int) and stop >= size)):
            return x
        items = [("s", None, None, None)] * dim + [("s", start, stop, step)]
        return self.index(x, items)

    def select(self, x: Ref, dim: int, i: int) -> Ref:
        dim %= self.rank(x)
        return self.index(x, [("s", None, None, None)] * dim + [("i", int(i))])

    # --- reductions ------------------------------------------------------------------------------
    def reduce(self, op: Op, x: Ref, dims: Sequence[int] | None, keepdim: bool) -> Ref:
        r = self.rank(x)
        if op is Op.MEAN and self.dtype(x) not in FLOATS:
            x = self.cast(x, "float32")
        if dims is None or len(dims) == 0:
            dims = list(range(r))
        if r == 0:
            return x
        # One dim at a time, highest first, so the remaining indices stay valid.
        for d in sorted({d % r for d in dims}, reverse=True):
            x = self.op(op, [x], dim=d, keepdim=keepdim)
        return x
