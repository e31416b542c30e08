"""EXTERN nodes' argument templates: a PyTorch operator's arguments, written as JSON into the IR.

`xg.compile(..., fallback="eager")` turns an operator the op table cannot translate into an EXTERN
node naming it (`aten.cumsum.default`) whose `args` attr is `dumps([args, kwargs])` of templates
in which `{"$t": i}` is the node's i-th tensor input, `{"$dtype": "float32"}` a dtype and
`{"$device": null}` the device the engine runs on. The importer writes them (here); the runtime
reads them back and calls the operator (runtime/extern.py), without importing the compiler.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import torch

from .builder import xg_dtype


def template(value: Any, tensor_index: Callable[[Any], int | None]) -> Any:
    """A JSON-able argument template: `tensor_index(x)` numbers a tensor operand (None: not one)."""
    if isinstance(value, (list, tuple)):
        return [template(v, tensor_index) for v in value]
    i = tensor_index(value)
    if i is not None:
        return {"$t": i}
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:
            raise ValueError("a NaN argument")
        return value
    if isinstance(value, torch.dtype):
        if xg_dtype(value) is None:
            raise ValueError(f"a {value} argument")
        return {"$dtype": xg_dtype(value)}
    if isinstance(value, torch.device):
        return {"$device": None}
    raise ValueError(f"an argument of type {type(value).__name__}")


def dumps(args: Any, kwargs: Any) -> str:
    """The `args` attr: canonical JSON (sorted keys, no spaces) so equal calls compare equal."""
    return json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"), allow_nan=True)
