"""ONNX values known at import time, and ONNX's dtypes: what the importer and its op tables share.

`Static` is a value the ONNX importer folds instead of emitting IR (an initializer, a constant, a
shape and whatever is computed from them alone, symbolic dims as sympy expressions). A module of
its own so that onnx_import.py (the walk) and onnx_ops.py / onnx_shape_ops.py (the table it walks
with) both import it, and neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from ..ir.graph import Dim
from .builder import TranslationError

# ONNX TensorProto element types -> XG dtypes
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 16: "bfloat16"}
NP_DTYPES = {"float32": np.float32, "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32,
             "int64": np.int64, "bool": np.bool_, "float16": np.float16, "float64": np.float64}


@dataclass
class Static:
    """A value known at import time: a numpy array (object dtype when it holds symbolic dims)."""
    array: np.ndarray
    dtype: str                          # the XG dtype it has in the model

    @property
    def symbolic(self) -> bool:
        return self.array.dtype == object and any(not _is_int(v) for v in self.array.reshape(-1))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) or (isinstance(v, sympy.Basic) and v.is_Integer)


def ir_dim(d: Any) -> Dim:
    if isinstance(d, (int, np.integer)):
        return int(d)
    if isinstance(d, sympy.Basic):
        return int(d) if d.is_Integer else str(d).replace(" ", "")
    raise TranslationError(f"a size {d!r}")
