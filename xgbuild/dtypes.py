"""XG dtype names and their torch dtypes: the one table code generation, the tuner and the runtime use.

Must match `compiler/frontend/types.py:DTYPES` (a test checks). A base module rather than part of
the compiler, so running an engine does not need the compiler, and below codegen, so kernel
templates need not import the runtime.
"""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
XG_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def xg_dtype(dtype: torch.dtype) -> str:
    """The XG name of a torch dtype; `ValueError` for dtypes XG has no name for (complex64, ...)."""
    try:
        return XG_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not an XG dtype (XG dtypes: {', '.join(TORCH_DTYPES)})") from None
