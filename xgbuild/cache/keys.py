"""Cache keys: a frozen set of *named* parts, hashed over their canonical JSON.

A key is everything that decides a tuned kernel: the kernel IR, the shapes and dtypes it runs on,
the GPU profile it was tuned for, the toolchain that built it, the search space and the tuning
policy, plus the artifact `kind`. Each part is a JSON tree (see `canonical`); the key's digest is
sha256 over `{"format": KEY_FORMAT, "parts": {...}}` in canonical form. Nothing that varies
between machines for the same work may go in a part: no paths, pointers, timestamps, hostnames or
device indices — a copied cache would otherwise miss for no reason.

Because the parts are named, a miss can be explained: `explain` lists them and `diff_keys` says
which ones (down to nested fields) differ between two keys.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Iterator, Mapping

from xgbuild.cache.canonical import JSONValue, canonical_json, dumps, freeze, thaw
from xgbuild.cache.digests import sha256_bytes
from xgbuild.cache.errors import KeyPartError, shorten
from xgbuild.cache.fingerprint import toolchain_fingerprint

KEY_FORMAT = "xg-cache-key/1"


@dataclass(frozen=True, eq=True)
class CacheKey:
    """The named parts of a cache key; `digest` is the 64-hex key the stores use."""

    kernel_ir: JSONValue            # the kernel's IR, as text or a JSON tree
    shapes: JSONValue               # concrete shapes of every operand
    dtypes: JSONValue               # dtypes of every operand
    gpu_profile: JSONValue          # the hw/ profile of the target GPU (arch, SMs, memory, ...)
    search_space: JSONValue         # the candidate configurations the tuner may try
    policy: JSONValue               # tuning policy: measure | cache | predict | strict, and its knobs
    toolchain: JSONValue = field(default_factory=toolchain_fingerprint)
    kind: str = "tuned-kernel"      # what the record holds, so different artifacts never collide

    def __post_init__(self) -> None:
        if type(self.kind) is not str or not self.kind:
            raise KeyPartError(f"key part 'kind' must be a non-empty str, got {shorten(self.kind)}")
        for name in part_names():
            # Deep-freeze so a caller mutating its dict afterwards cannot change a built key.
            object.__setattr__(self, name, freeze(getattr(self, name), f"key part {name!r}"))

    def __hash__(self) -> int:
        return hash(self.digest)

    def parts(self) -> Mapping[str, JSONValue]:
        """The parts by name, in a fixed order."""
        return {name: getattr(self, name) for name in part_names()}

    def payload(self) -> dict:
        """The plain JSON object that is hashed (and embedded in every record)."""
        return {"format": KEY_FORMAT, "parts": thaw(self.parts())}

    @functools.cached_property
    def canonical(self) -> bytes:
        return dumps(self.payload())

    @functools.cached_property
    def digest(self) -> str:
        return sha256_bytes(self.canonical)

    @classmethod
    def from_payload(cls, payload: object) -> "CacheKey":
        """Rebuild a key from `payload()` output (e.g. read back from a record)."""
        if not isinstance(payload, Mapping) or payload.get("format") != KEY_FORMAT:
            raise KeyPartError(f"not a cache key payload of format {KEY_FORMAT!r}")
        parts = payload.get("parts")
        if not isinstance(parts, Mapping) or set(parts) != set(part_names()):
            got = sorted(parts) if isinstance(parts, Mapping) else type(parts).__name__
            raise KeyPartError(f"cache key parts must be exactly {list(part_names())}, got {got}")
        return cls(**parts)


@functools.cache
def part_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(CacheKey))


def explain(key: CacheKey) -> list[str]:
    """One line per part: `name: <canonical JSON>`, followed by the digest."""
    lines = [f"key {key.digest}"]
    for name, value in key.parts().items():
        lines.append(f"  {name}: {canonical_json(value).decode()}")
    return lines


class _Absent:
    """Marks a field present in one key and not the other (distinct from any JSON value)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


@dataclass(frozen=True)
class PartDiff:
    """One difference between two keys: a dotted path into the parts and both values."""

    path: str
    left: JSONValue     # or ABSENT
    right: JSONValue    # or ABSENT


def diff_keys(left: CacheKey, right: CacheKey) -> list[PartDiff]:
    """Every place where two keys differ, descending into mappings to name the exact field."""
    return list(_diff(left.parts(), right.parts(), ""))


def _diff(a: JSONValue, b: JSONValue, path: str) -> Iterator[PartDiff]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else k
            if k not in a:
                yield PartDiff(sub, ABSENT, b[k])
            elif k not in b:
                yield PartDiff(sub, a[k], ABSENT)
            else:
                yield from _diff(a[k], b[k], sub)
    elif canonical_json(a) != canonical_json(b):
        # Compared by canonical bytes: 1 and 1.0 (or True and 1) are different parts.
        yield PartDiff(path, a, b)


def render_value(value: JSONValue, limit: int = 160) -> str:
    if value is ABSENT:
        return repr(value)
    text = canonical_json(value).decode()
    return text if len(text) <= limit else f"{text[:limit - 1]}… ({len(text)} chars)"
