"""XG dtype names and their torch dtypes: the one table code generation, the tuner and the runtime use.

Must match `compiler/frontend/types.py:DTYPES` (a test checks). A base module rather than part of
the compiler, so running an engine does not need the compiler, and below codegen, so kernel
templates need not import the runtime. `ITEMSIZE` and `FLOAT_DTYPES` need no torch (an engine's
reader, on a deploy host, uses them); `TORCH_DTYPES` and `XG_NAMES` import torch when first read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ITEMSIZE: dict[str, int] = {
    "bool": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def _torch_tables() -> dict[str, Any]:
    import torch
    torch_dtypes = {
        "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
        "int64": torch.int64, "uint8": torch.uint8, "float16": torch.float16,
        "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    }
    return {"TORCH_DTYPES": torch_dtypes, "XG_NAMES": {dtype: name for name, dtype in torch_dtypes.items()}}


def __getattr__(name: str) -> Any:
    """`TORCH_DTYPES` (XG name -> torch dtype) and `XG_NAMES` (the reverse), made on first use."""
    if name in ("TORCH_DTYPES", "XG_NAMES"):
        globals().update(_torch_tables())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def xg_dtype(dtype: "torch.dtype") -> str:
    """The XG name of a torch dtype; `ValueError` for dtypes XG has no name for (complex64, ...)."""
    names = __getattr__("XG_NAMES") if "XG_NAMES" not in globals() else globals()["XG_NAMES"]
    try:
        return names[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not an XG dtype (XG dtypes: {', '.join(ITEMSIZE)})") from None
