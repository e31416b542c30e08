"""The ONNX translation table and what its entries share: `op` registers a translation under one
or more op types; `static`, `ints`, `all_static` read constant (folded) inputs.

onnx_ops.py and onnx_shape_ops.py register into `TABLE`; onnx_import.py imports both and reads it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from .builder import Table, TranslationError
from .onnx_values import Static

TABLE = Table()
op = TABLE.op


def static(v: Any, what: str) -> np.ndarray:
    if not isinstance(v, Static):
        raise TranslationError(f"{what} must be a constant (it is computed at run time)")
    return v.array


def ints(v: Any, what: str) -> list:
    return [d if isinstance(d, sympy.Basic) and not d.is_Integer else int(d) for d in static(v, what).reshape(-1)]


def all_static(args) -> bool:
    return all(a is None or isinstance(a, Static) for a in args)
