"""The caller's side of a PyTorch model XG captures: which of `forward`'s parameters the example
inputs fill (positionally and by keyword), which of them are tensors (the engine's inputs, named
as the parameters) and which are constants the capture fixed (None, bools, numbers, strings,
`forward`'s defaults included). The engine binds its calls with the same names
(xgbuild/runtime/model_engine.py).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ...errors import XGError

# Python values torch.export specialises the graph to: an engine is built for exactly that value.
CONSTANT_TYPES = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class ExampleCall:
    """The example inputs bound to the model's parameters."""
    args: tuple                             # positional example values, as given (tensors detached)
    kwargs: dict[str, Any]                  # keyword example values, as given (tensors detached)
    names: tuple[str, ...]                  # the parameter each of args then kwargs fills, in that order
    params: tuple[str, ...]                 # the names positional arguments fill, in order
    fixed: dict[str, Any] = field(default_factory=dict)   # non-tensor parameters -> their captured value


def example_call(fn: Any, example_inputs: Any, example_kwargs: Any) -> ExampleCall:
    """Check the example inputs (each refusal an XGError naming the value) and bind them to
    `fn`'s signature."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if example_inputs is None:
        example_inputs = ()
    if example_kwargs is None:
        example_kwargs = {}
    if not isinstance(example_inputs, (tuple, list)):
        raise XGError(f"example_inputs must be a tuple of tensors, e.g. example_inputs=(x,), got a "
                      f"{type(example_inputs).__name__}")
    if not isinstance(example_kwargs, Mapping):
        raise XGError(f"example_kwargs must be a dict of keyword inputs, e.g. example_kwargs={{'input_ids': ids}}, "
                      f"got a {type(example_kwargs).__name__}")
    if not example_inputs and not example_kwargs:
        raise XGError("example_inputs must be a non-empty tuple of tensors, e.g. example_inputs=(x,), or "
                      "example_kwargs a dict of them")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor) and x is not None:
            raise XGError(f"example_inputs[{i}] is a {type(x).__name__}; pass tensors (None skips a parameter; "
                          "pass other constants by keyword, in example_kwargs)")
    for k, v in example_kwargs.items():
        if not isinstance(k, str):
            raise XGError(f"example_kwargs keys must be parameter names, got {k!r}")
        if not isinstance(v, torch.Tensor) and not isinstance(v, CONSTANT_TYPES):
            raise XGError(f"example_kwargs[{k!r}] is a {type(v).__name__}; pass tensors, or constants "
                          "(None, bool, int, float, str) the engine is then built for")
    args = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in example_inputs)
    kwargs = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in example_kwargs.items()}
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is None:                         # no signature to read: inputs named by position
        names = tuple(f"args_{i}" for i in range(len(args))) + tuple(kwargs)
        return ExampleCall(args, kwargs, names, names[:len(args)], _constants(names, args, kwargs))
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise XGError(f"the example inputs do not fit the model's parameters {sig}: {exc}") from None
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    params = [p.name for p in positional]
    var = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_POSITIONAL), None)
    if var is not None:
        params += [f"{var}_{i}" for i in range(len(args) - len(positional))]
    names = tuple(params[:len(args)]) + tuple(kwargs)
    fixed = _constants(names, args, kwargs)
    for p in sig.parameters.values():       # those left out take their defaults, fixed as well
        if p.name not in names and p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            fixed[p.name] = p.default
    return ExampleCall(args, kwargs, names, tuple(params), fixed)


def _constants(names: Sequence[str], args: tuple, kwargs: dict) -> dict[str, Any]:
    return {n: v for n, v in zip(names, (*args, *kwargs.values())) if not isinstance(v, torch.Tensor)}


def complete_dynamic_shapes(dynamic_shapes: Any, call: ExampleCall) -> Any:
    """`dynamic_shapes` by parameter name, with the inputs it leaves out static (torch.export wants
    every input named); a name that is no input is an XGError listing the inputs."""
    if not isinstance(dynamic_shapes, Mapping):
        return dynamic_shapes
    unknown = [k for k in dynamic_shapes if k not in call.names]
    if unknown:
        raise XGError(f"dynamic_shapes names {', '.join(f'`{k}`' for k in unknown)}, which the example inputs do "
                      f"not give; they give {', '.join(f'`{n}`' for n in call.names)}")
    return {n: dynamic_shapes.get(n) for n in call.names}


def dim_names(dynamic_shapes: Any, names: Sequence[str]) -> dict[tuple[str, int], str]:
    """(input name, axis) -> the name of the `Dim` the caller gave it. `dynamic_shapes` as
    torch.export takes it: a dict by parameter name, or a tuple in the order of the inputs
    (positional, then keyword)."""
    out: dict[tuple[str, int], str] = {}
    if dynamic_shapes is None:
        return out
    if isinstance(dynamic_shapes, Mapping):
        specs = [(n, dynamic_shapes.get(n)) for n in names]
    else:
        specs = list(zip(names, dynamic_shapes))
    for input_name, spec in specs:
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ()) \
            if isinstance(spec, (tuple, list)) else ()
        for axis, d in items:
            name = getattr(d, "__name__", None)
            if name:
                out[(input_name, int(axis))] = re.sub(r"\W", "_", name)
    return out


class FunctionModule(torch.nn.Module):
    """A plain function as a module, so that functions export like models. Its `forward` shows
    the function's own signature, so inputs are named (and dynamic_shapes keyed) as its
    parameters."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def function_module(fn: Any) -> torch.nn.Module:
    """`fn` as a module whose `forward` has `fn`'s signature (torch.export reads it)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return FunctionModule(fn)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])
    cls = type("FunctionModule", (FunctionModule,), {"forward": forward})
    return cls(fn)


__all__ = ["CONSTANT_TYPES", "ExampleCall", "complete_dynamic_shapes", "dim_names", "example_call", "function_module"]
