"""The ATen translation table and what its entries share: `op` registers a translation under
one or more op packets; `arg`, `tensor`, `pair`, `pads`, `out_dtype` read their arguments.

aten_ops.py (element-wise, contractions, norms, reductions) and aten_shape_ops.py (shape, source,
convolution and pooling ops) register into `TABLE`; torch_export.py imports both and reads it.
"""

from __future__ import annotations

from typing import Any

from .builder import Table, TranslationError, Ref, is_node, xg_dtype

TABLE = Table()
op = TABLE.op


def arg(args: list, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def tensor(v: Any, what: str) -> Ref:
    if not is_node(v):
        raise TranslationError(f"{what} is not a tensor ({type(v).__name__})")
    return v


def pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[-1]))
    return (int(v), int(v))


def pads(v) -> tuple[int, int, int, int]:
    """PyTorch's symmetric (h, w) padding as (top, bottom, left, right)."""
    h, w = pair(v)
    return (h, h, w, w)


def out_dtype(node) -> str:
    return xg_dtype(node.meta["val"].dtype) or "float32"
