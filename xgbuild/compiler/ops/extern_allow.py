"""Which PyTorch operators an EXTERN node may call, and with which arguments.

The eager fallback (`xg.compile(..., fallback="eager")`) writes the operator's name and a JSON
template of its arguments into the program; an engine file is data anyone who can write it can
edit. So the operator is looked up in a fixed allow-list of pure ATen tensor operators (namespace
`aten`, explicit overloads) and every argument is checked against the operator's schema before
anything runs: tensors only as `{"$t": i}` with `i` one of the node's inputs, dtypes only as
`{"$dtype": <XG dtype>}`, the device only as `{"$device": null}`, numbers and bools and lists of
them, None where the schema says Optional, and strings only for the few arguments listed in
`STRINGS` with their allowed values.

Left off on purpose: anything doing I/O, storage or library loading (`from_file`, `save`, `load`),
random operators (their state is not the engine's), in-place and `out=` variants (PyTorch must not
write into XG's buffers), factories whose size comes from the arguments (`empty`, `full`, `arange`:
a forged engine could allocate without bound), and data-dependent output shapes (`nonzero`).
Allocation by listed operators is bounded at call time (runtime/extern.py dry-runs each call on
the `meta` device and compares the result's size with the node's).

The compiler (importers/torch_export.py) and the runtime (runtime/extern.py) share this table,
so an operator that is refused here is reported as unsupported at compile time.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from ...dtypes import TORCH_DTYPES

# packet -> overloads. Derived from what the importers emit as fallback (ATen ops with no
# translation, forms the table cannot express, functional forms of in-place ops) plus common pure
# math and shape ops; every entry is checked by tests (exists, not mutable, has a Meta kernel).
ALLOWED_OVERLOADS: dict[str, tuple[str, ...]] = {
    # element-wise math
    "abs": ("default",), "neg": ("default",), "exp": ("default",), "exp2": ("default",),
    "expm1": ("default",), "log": ("default",), "log2": ("default",), "log10": ("default",),
    "log1p": ("default",), "sqrt": ("default",), "rsqrt": ("default",), "sin": ("default",),
    "cos": ("default",), "tan": ("default",), "asin": ("default",), "acos": ("default",),
    "atan": ("default",), "atan2": ("default",), "sinh": ("default",), "cosh": ("default",),
    "tanh": ("default",), "asinh": ("default",), "acosh": ("default",), "atanh": ("default",),
    "erf": ("default",), "erfc": ("default",), "erfinv": ("default",), "sigmoid": ("default",),
    "logit": ("default",), "relu": ("default",), "relu6": ("default",), "gelu": ("default",),
    "silu": ("default",), "mish": ("default",), "elu": ("default",), "selu": ("default",),
    "celu": ("default",), "leaky_relu": ("default",), "hardtanh": ("default",),
    "hardsigmoid": ("default",), "hardswish": ("default",), "softplus": ("default",),
    "floor": ("default",), "ceil": ("default",), "round": ("default", "decimals"),
    "trunc": ("default",), "frac": ("default",), "sign": ("default",), "sgn": ("default",),
    "reciprocal": ("default",), "square": ("default",),
    "pow": ("Tensor_Tensor", "Tensor_Scalar", "Scalar"), "add": ("Tensor", "Scalar"),
    "sub": ("Tensor", "Scalar"), "rsub": ("Tensor", "Scalar"), "mul": ("Tensor", "Scalar"),
    "div": ("Tensor", "Scalar", "Tensor_mode", "Scalar_mode"), "true_divide": ("Tensor", "Scalar"),
    "floor_divide": ("default", "Scalar"), "remainder": ("Tensor", "Scalar", "Scalar_Tensor"),
    "fmod": ("Tensor", "Scalar"), "maximum": ("default",), "minimum": ("default",),
    "fmax": ("default",), "fmin": ("default",), "clamp": ("default", "Tensor"),
    "clamp_min": ("default", "Tensor"), "clamp_max": ("default", "Tensor"), "clip": ("default", "Tensor"),
    "lerp": ("Scalar", "Tensor"), "addcmul": ("default",), "addcdiv": ("default",),
    "where": ("self", "ScalarOther", "ScalarSelf", "Scalar"), "masked_fill": ("Scalar", "Tensor"),
    "eq": ("Tensor", "Scalar"), "ne": ("Tensor", "Scalar"), "lt": ("Tensor", "Scalar"),
    "le": ("Tensor", "Scalar"), "gt": ("Tensor", "Scalar"), "ge": ("Tensor", "Scalar"),
    "logical_and": ("default",), "logical_or": ("default",), "logical_xor": ("default",),
    "logical_not": ("default",), "bitwise_and": ("Tensor", "Scalar", "Scalar_Tensor"),
    "bitwise_or": ("Tensor", "Scalar", "Scalar_Tensor"), "bitwise_xor": ("Tensor", "Scalar", "Scalar_Tensor"),
    "bitwise_not": ("default",), "isnan": ("default",), "isinf": ("default",), "isfinite": ("default",),
    "nan_to_num": ("default",),
    # reductions, scans, sorting
    "sum": ("dim_IntList", "default"), "mean": ("default", "dim"), "prod": ("default", "dim_int"),
    "amax": ("default",), "amin": ("default",), "max": ("other", "default", "dim"),
    "min": ("other", "default", "dim"), "argmax": ("default",), "argmin": ("default",),
    "any": ("default", "dim", "dims"), "all": ("default", "dim", "dims"),
    "std": ("default", "dim", "correction"), "var": ("default", "dim", "correction"),
    "std_mean": ("default", "dim", "correction"), "var_mean": ("default", "dim", "correction"),
    "logsumexp": ("default",), "cumsum": ("default",), "cumprod": ("default",), "cummax": ("default",),
    "cummin": ("default",), "logcumsumexp": ("default",), "linalg_vector_norm": ("default",),
    "topk": ("default",), "sort": ("default", "stable"), "argsort": ("default", "stable"),
    "kthvalue": ("default",), "median": ("default", "dim"), "softmax": ("int",), "log_softmax": ("int",),
    "_softmax": ("default",), "_log_softmax": ("default",),
    # contractions and norms
    "mm": ("default",), "bmm": ("default",), "matmul": ("default",), "addmm": ("default",),
    "baddbmm": ("default",), "linear": ("default",), "dot": ("default",), "outer": ("default",),
    "layer_norm": ("default",), "native_layer_norm": ("default",), "group_norm": ("default",),
    "native_group_norm": ("default",), "batch_norm": ("default",),
    "_native_batch_norm_legit_no_training": ("default",), "rms_norm": ("default",),
    # shapes, views, indexing
    "reshape": ("default",), "view": ("default", "dtype"), "_unsafe_view": ("default",),
    "view_as": ("default",), "permute": ("default",), "transpose": ("int",), "t": ("default",),
    "squeeze": ("default", "dim", "dims"), "unsqueeze": ("default",), "flatten": ("using_ints",),
    "unflatten": ("int",), "expand": ("default",), "expand_as": ("default",), "broadcast_to": ("default",),
    "contiguous": ("default",), "clone": ("default",), "alias": ("default",), "detach": ("default",),
    "select": ("int",), "slice": ("Tensor",), "narrow": ("default", "Tensor"), "cat": ("default",),
    "stack": ("default",), "split": ("Tensor",), "split_with_sizes": ("default",), "chunk": ("default",),
    "unbind": ("int",), "flip": ("default",), "roll": ("default",), "tril": ("default",),
    "triu": ("default",), "diag": ("default",), "diagonal": ("default",), "repeat": ("default",),
    "tile": ("default",), "repeat_interleave": ("Tensor", "self_Tensor", "self_int"),
    "gather": ("default",), "index_select": ("default",), "index": ("Tensor",), "index_put": ("default",),
    "take_along_dim": ("default",), "scatter": ("value", "src", "reduce", "value_reduce"),
    "scatter_add": ("default",), "scatter_reduce": ("two",), "index_add": ("default",),
    "index_copy": ("default",), "index_fill": ("int_Tensor", "int_Scalar"), "masked_scatter": ("default",),
    "constant_pad_nd": ("default",), "reflection_pad1d": ("default",), "reflection_pad2d": ("default",),
    "replication_pad1d": ("default",), "replication_pad2d": ("default",), "embedding": ("default",),
    "one_hot": ("default",), "searchsorted": ("Tensor", "Scalar"), "bucketize": ("Tensor", "Scalar"),
    "_to_copy": ("default",), "type_as": ("default",),
    # convolution, pooling, resampling, attention
    "conv1d": ("default",), "conv2d": ("default",), "convolution": ("default",),
    "max_pool2d": ("default",), "max_pool2d_with_indices": ("default",), "avg_pool2d": ("default",),
    "adaptive_avg_pool2d": ("default",), "adaptive_avg_pool1d": ("default",),
    "upsample_nearest2d": ("default", "vec"), "upsample_bilinear2d": ("default", "vec"),
    "pixel_shuffle": ("default",), "scaled_dot_product_attention": ("default",),
}
ALLOWED: frozenset[str] = frozenset(f"aten.{p}.{o}" for p, os_ in ALLOWED_OVERLOADS.items() for o in os_)

# The only string arguments an EXTERN call may carry: (operator, argument) -> allowed values.
STRINGS: dict[tuple[str, str], frozenset[str]] = {
    ("aten.div.Tensor_mode", "rounding_mode"): frozenset({"trunc", "floor"}),
    ("aten.div.Scalar_mode", "rounding_mode"): frozenset({"trunc", "floor"}),
    ("aten.gelu.default", "approximate"): frozenset({"none", "tanh"}),
    ("aten.scatter.reduce", "reduce"): frozenset({"add", "multiply"}),
    ("aten.scatter.value_reduce", "reduce"): frozenset({"add", "multiply"}),
    ("aten.scatter_reduce.two", "reduce"): frozenset({"sum", "prod", "mean", "amax", "amin"}),
    ("aten.searchsorted.Tensor", "side"): frozenset({"left", "right"}),
    ("aten.searchsorted.Scalar", "side"): frozenset({"left", "right"}),
}

MAX_ARGS_CHARS = 1 << 20        # a call's JSON template: a few numbers and lists, never megabytes
MAX_LIST = 4096                 # elements of one list argument
_INT64 = 1 << 63
_NAME = re.compile(r"aten\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


class ExternRefused(Exception):
    """An EXTERN call that is not on the list or whose arguments do not fit its schema."""


def is_allowed(name: str) -> bool:
    """Whether `name` (`aten.cumsum.default`) is an operator the eager fallback may call."""
    return isinstance(name, str) and name in ALLOWED


def operator(name: str) -> torch._ops.OpOverload:
    """The allowed operator `name` resolves to; `ExternRefused` for any other name. Only names
    from the table reach `getattr`, so no attribute path of an engine's choosing is followed."""
    if not is_allowed(name):
        shown = name if isinstance(name, str) and len(name) <= 120 and _NAME.fullmatch(name) else repr(name)[:120]
        raise ExternRefused(f"`{shown}` is not on XG's list of PyTorch operators the eager fallback may call "
                            "(pure aten tensor ops: no I/O, storage, library loading, random or in-place ops)")
    _, packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def check_call(name: str, args_json: Any, n_tensors: int) -> tuple[torch._ops.OpOverload, list, dict]:
    """The operator and its (args, kwargs) templates, checked against its schema; `ExternRefused`
    saying what is wrong. `n_tensors`: how many tensor inputs the node has (`{"$t": i}` ranges)."""
    op = operator(name)
    if not isinstance(args_json, str) or len(args_json) > MAX_ARGS_CHARS:
        raise ExternRefused(f"`{name}` has an argument template that is not a JSON string of at most "
                            f"{MAX_ARGS_CHARS} characters")
    try:
        parsed = json.loads(args_json)
    except (ValueError, RecursionError):
        raise ExternRefused(f"`{name}` has an argument template that is not valid JSON") from None
    if not (isinstance(parsed, list) and len(parsed) == 2 and isinstance(parsed[0], list)
            and isinstance(parsed[1], dict)):
        raise ExternRefused(f"`{name}` has an argument template that is not [args, kwargs]")
    args, kwargs = parsed
    schema = op._schema
    params = list(schema.arguments)
    positional = [a for a in params if not a.kwarg_only]
    if len(args) > len(positional):
        raise ExternRefused(f"`{name}` takes at most {len(positional)} positional arguments, the engine gives "
                            f"{len(args)}")
    given: dict[str, Any] = {}
    for a, v in zip(positional, args):
        given[a.name] = v
    by_name = {a.name: a for a in params}
    for k, v in kwargs.items():
        if k not in by_name:
            raise ExternRefused(f"`{name}` has no argument named {k[:60]!r}")
        if k in given:
            raise ExternRefused(f"`{name}` is given `{k}` twice")
        given[k] = v
    for a in params:
        if a.name not in given:
            if not a.has_default_value():
                raise ExternRefused(f"`{name}` needs its argument `{a.name}`")
            continue
        why = _check(given[a.name], a.real_type, a.N, n_tensors, (name, a.name))
        if why:
            raise ExternRefused(f"`{name}` argument `{a.name}` ({a.real_type}): {why}")
    return op, args, kwargs


def _check(v: Any, t: Any, n: int | None, n_tensors: int, where: tuple[str, str]) -> str | None:
    """None when JSON value `v` is a value of schema type `t`, else why not."""
    kind = str(t)
    if isinstance(t, torch._C.OptionalType):
        return None if v is None else _check(v, t.getElementType(), n, n_tensors, where)
    if isinstance(t, torch._C.ListType):
        elem = t.getElementType()
        if not isinstance(v, list):
            # `int[2] stride=2`: PyTorch takes one int for a fixed-size int list
            if n is not None and str(elem) == "int":
                return _check(v, elem, None, n_tensors, where)
            return f"expected a list, got {_kind(v)}"
        if len(v) > MAX_LIST:
            return f"a list of {len(v)} elements (at most {MAX_LIST})"
        for x in v:
            why = _check(x, elem, None, n_tensors, where)
            if why:
                return f"an element: {why}"
        return None
    if kind == "Tensor":
        if not (isinstance(v, dict) and set(v) == {"$t"}):
            return f"a tensor must be {{\"$t\": i}}, got {_kind(v)}"
        i = v["$t"]
        if type(i) is not int or not 0 <= i < n_tensors:
            return f"tensor index {str(i)[:20]} is not one of the node's {n_tensors} inputs"
        return None
    if kind == "int":
        return None if type(v) is int and -_INT64 <= v < _INT64 else f"expected an int64, got {_kind(v)}"
    if kind == "float":
        return None if type(v) in (int, float) else f"expected a number, got {_kind(v)}"
    if kind == "bool":
        return None if type(v) is bool else f"expected a bool, got {_kind(v)}"
    if kind == "number":
        return None if type(v) in (int, float, bool) else f"expected a number, got {_kind(v)}"
    if kind == "ScalarType":
        ok = isinstance(v, dict) and set(v) == {"$dtype"} and v["$dtype"] in TORCH_DTYPES
        return None if ok else f"a dtype must be {{\"$dtype\": <one of {', '.join(TORCH_DTYPES)}>}}"
    if kind == "Device":
        ok = isinstance(v, dict) and set(v) == {"$device"} and v["$device"] is None
        return None if ok else "a device must be {\"$device\": null} (the device the engine runs on)"
    if kind == "str":
        allowed = STRINGS.get(where)
        if allowed is None:
            return "takes no string from an engine"
        return None if isinstance(v, str) and v in allowed else f"must be one of {', '.join(sorted(allowed))}"
    return f"XG passes no {kind} to the eager fallback"


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return "an object with keys " + ", ".join(sorted(str(k)[:20] for k in v)[:4])
    if isinstance(v, str):
        return "a string"
    return type(v).__name__
