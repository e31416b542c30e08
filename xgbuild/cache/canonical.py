"""Canonical JSON: the one byte form that cache keys and records are hashed and stored in.

Values are JSON trees of exactly these types: `str`, `int`, `float` (finite), `bool`, `None`,
mappings with `str` keys, and lists/tuples. Anything else (a set, bytes, NaN, an enum, a numpy
scalar, an object) is refused with the path to the offending value, instead of being turned into
text by `str()` — `str()` of a container depends on insertion order and on repr details that
change between versions, which would make equal keys hash differently.

`freeze` copies a tree into an immutable one (mappings become sorted `MappingProxyType`s, lists
become tuples) so a frozen dataclass holding it really is frozen. `canonical_json` serialises with
sorted keys, no whitespace and ASCII-only output, so the bytes do not depend on dict order, on
`PYTHONHASHSEED` or on the locale.
"""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import Any, Mapping

from xgbuild.cache.errors import KeyPartError, shorten

JSONValue = Any  # a tree of the types listed in the module docstring

_SCALARS = (str, int, bool, type(None))


def freeze(value: JSONValue, where: str = "value") -> JSONValue:
    """An immutable deep copy of a JSON tree; raises `KeyPartError` naming the bad element."""
    kind = type(value)
    # Exact type checks: a subclass (IntEnum, a str subclass) may serialise differently later.
    if kind in _SCALARS:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise KeyPartError(f"{where} is {value!r}: NaN and infinities have no canonical form")
        return value
    if isinstance(value, Mapping):
        items = {}
        for k, v in value.items():
            if type(k) is not str:
                raise KeyPartError(
                    f"{where} has a key {shorten(k)} of type {type(k).__name__}: keys must be str"
                )
            items[k] = freeze(v, f"{where}[{k!r}]")
        return MappingProxyType(dict(sorted(items.items())))
    if kind in (list, tuple):
        return tuple(freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise KeyPartError(
        f"{where} is a {kind.__name__} ({shorten(value)}): only str, int, float, bool, None, "
        "lists and str-keyed mappings have a canonical form"
    )


def thaw(value: JSONValue) -> JSONValue:
    """A plain (mutable) copy of a frozen tree: dicts and lists, ready for `json`."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: JSONValue) -> bytes:
    """The canonical bytes of a JSON tree (validated through `freeze` first)."""
    return dumps(thaw(freeze(value)))


def dumps(plain: JSONValue) -> bytes:
    """Canonical bytes of an already validated plain tree (no second validation pass)."""
    return json.dumps(
        plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")
