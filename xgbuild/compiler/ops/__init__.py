"""The op registry: every IR op declared once (core.py's `Op`, an `OpDef` in a family module).

    op_def(op)            everything about one op
    by_builtin(name)      the op a language builtin lowers to
    by_aten(name)         the op an ATen op packet maps to one to one (importers)
    by_onnx(name)         the op an ONNX op type maps to one to one (importers)

and the op families as sets, derived from the definitions (`UNARY`, `BINARY`, `COMPARE`, ...).
This package imports nothing else of XG: every stage of the pipeline may depend on it.
"""

from __future__ import annotations

from types import MappingProxyType

from . import attention, elementwise, structural
from .core import (BroadcastError, DTYPES, FLOATS, INTEGERS, NO_GRADIENT, Dim, Kind, Op, OpDef, Operands, Shape, ShapeError,
                   TritonCtx, attrs_of, broadcast)
from .structural import index_shape, numel


def _table() -> dict[Op, OpDef]:
    table: dict[Op, OpDef] = {}
    for d in (*elementwise.DEFS, *structural.DEFS, *attention.DEFS):
        if d.op in table:
            raise RuntimeError(f"op `{d.op.value}` is defined twice")
        table[d.op] = d
    missing = [op.value for op in Op if op not in table]
    if missing:
        raise RuntimeError(f"ops without a definition: {', '.join(missing)}")
    return table


REGISTRY: "MappingProxyType[Op, OpDef]" = MappingProxyType(_table())


def _index(field: str) -> dict[str, Op]:
    out: dict[str, Op] = {}
    for d in REGISTRY.values():
        for name in (getattr(d, field) if isinstance(getattr(d, field), tuple) else (getattr(d, field),)):
            if name is None:
                continue
            if name in out:
                raise RuntimeError(f"`{name}` maps to both `{out[name].value}` and `{d.op.value}`")
            out[name] = d.op
    return out


BUILTINS = MappingProxyType(_index("builtin"))
ATEN = MappingProxyType(_index("aten"))
ONNX = MappingProxyType(_index("onnx"))


def op_def(op: Op) -> OpDef:
    return REGISTRY[op]


def by_builtin(name: str) -> OpDef | None:
    op = BUILTINS.get(name)
    return REGISTRY[op] if op is not None else None


def by_aten(name: str) -> Op | None:
    return ATEN.get(name)


def by_onnx(name: str) -> Op | None:
    return ONNX.get(name)


def _of(*kinds: Kind) -> frozenset[Op]:
    return frozenset(d.op for d in REGISTRY.values() if d.kind in kinds)


UNARY = _of(Kind.UNARY)
BINARY = _of(Kind.BINARY)
COMPARE = frozenset(d.op for d in REGISTRY.values() if d.infer is elementwise._compare)
REDUCE = _of(Kind.REDUCE)
COLLECTIVE = _of(Kind.COLLECTIVE)
SOURCES = _of(Kind.SOURCE)
# The builtins that are one element-wise op of one tensor (the checker's and lowering's table).
UNARY_BUILTINS = MappingProxyType({d.builtin: d.op for d in REGISTRY.values() if d.kind is Kind.UNARY and d.builtin})

__all__ = ["ATEN", "BINARY", "BroadcastError", "BUILTINS", "COLLECTIVE", "COMPARE", "DTYPES", "Dim", "FLOATS", "INTEGERS", "Kind",
           "NO_GRADIENT", "ONNX", "Op", "OpDef", "Operands", "REDUCE", "REGISTRY", "SOURCES", "Shape", "ShapeError",
           "TritonCtx", "UNARY", "UNARY_BUILTINS", "attrs_of", "broadcast", "by_aten", "by_builtin", "by_onnx",
           "index_shape", "numel", "op_def"]
