"""EXTERN nodes: a PyTorch operator the engine calls eagerly (`xg.compile(..., fallback="eager")`).

The node names the operator (`aten.cumsum.default`) and keeps its arguments as a JSON template in
which `{"$t": i}` is the node's i-th tensor input, `{"$dtype": "float32"}` a dtype and
`{"$device": null}` the device the engine runs on (compiler/importers/extern_args.py writes
them). Every executor (CPU, CPU float64 reference, CUDA) calls the operator through `torch.ops`,
so a saved engine runs in `xgrun` as well; an operator from a library the running process has not
loaded is an error that names it.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ..compiler.ir.graph import Node
from ..errors import ExecutionError
from ..dtypes import TORCH_DTYPES, XG_NAMES


def resolve(name: str) -> Any:
    """`torch.ops.<namespace>.<op>.<overload>` from its dotted name."""
    parts = name.split(".")
    if len(parts) != 3:
        raise ExecutionError(f"the engine calls the operator `{name}`, which is not a torch operator name")
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        raise ExecutionError(f"the engine calls the PyTorch operator `{name}` (compiled with fallback='eager'), "
                             f"which this process does not define: import the library that registers it "
                             f"before running the engine") from None


def call(n: Node, tensors: list[torch.Tensor], device: torch.device, memo: dict | None = None,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """The node's value: its operator called on `tensors` (the node's inputs, in order), of `dtype`
    (default: the node's; the float64 reference passes float64). An operator with several results
    has one node per result; with a run's `memo` it is called once for all."""
    key = (n.attr("call"), n.attr("args"))
    if memo is not None and n.attr("output") is not None:
        for ins, out in memo.get(key, ()):
            if len(ins) == len(tensors) and all(a is b for a, b in zip(ins, tensors)):
                return _pick(n, out, dtype)
    fn = resolve(n.attr("call"))
    args, kwargs = json.loads(n.attr("args"))

    def build(v: Any) -> Any:
        if isinstance(v, list):
            return [build(x) for x in v]
        if isinstance(v, dict):
            if "$t" in v:
                return tensors[v["$t"]]
            if "$dtype" in v:
                return TORCH_DTYPES[v["$dtype"]]
            if "$device" in v:
                return device
        return v
    try:
        out = fn(*build(args), **{k: build(v) for k, v in kwargs.items()})
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        raise ExecutionError(f"the eager PyTorch operator `{n.attr('call')}` (node %{n.id}) failed: {exc}") from None
    if memo is not None and n.attr("output") is not None:
        memo.setdefault(key, []).append((list(tensors), out))
    return _pick(n, out, dtype)


def _pick(n: Node, out: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """The node's result out of what the operator returned, checked against the compiled dtype and shape."""
    index = n.attr("output")
    if index is not None:
        out = out[index]
    want = dtype or TORCH_DTYPES[n.dtype]
    if isinstance(out, torch.Tensor) and out.dtype != want and out.is_floating_point() and want.is_floating_point:
        out = out.to(want)          # e.g. an explicit dtype argument under the float64 reference
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(n.shape) or out.dtype != want:
        got = f"{XG_NAMES.get(out.dtype, out.dtype)}{list(out.shape)}" if isinstance(out, torch.Tensor) \
            else type(out).__name__
        raise ExecutionError(f"the eager PyTorch operator `{n.attr('call')}` (node %{n.id}) returned {got}, "
                             f"but the engine was compiled for {XG_NAMES.get(want, want)}{list(n.shape)}")
    return out
