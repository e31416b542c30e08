"""Cache forensics: turning a key into an answer.

- `describe` names the kernel a key is for (kind, op, shape, dtypes, GPU), for `cache ls` and
  messages, so a row of hex is never all a user sees.
- `resolve_key` accepts the full 64-hex key or a unique prefix of it (at least `MIN_PREFIX`
  characters) against the local store; an ambiguous prefix lists what it matches.
- `Neighbours.nearest` finds the stored key closest to a missing one: the same `kind` and op, with
  the most equal parts; `miss_report` prints a miss as the key, its parts and how that neighbour
  differs, which is the answer to "why did this miss?" without a second command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from xgbuild.cache.canonical import canonical_json
from xgbuild.cache.digests import DIGEST_LEN, is_digest
from xgbuild.cache.errors import AmbiguousKeyError, CacheError, InvalidDigestError, shorten
from xgbuild.cache.keys import CacheKey, PartDiff, diff_keys, render_value
from xgbuild.cache.local import LocalStore
from xgbuild.cache.records import Record

MIN_PREFIX = 4
_HEX = re.compile(r"[0-9a-f]+")
SHOWN_DIFFS = 12        # a miss report lists at most this many differing fields


# --- naming a key's kernel ---------------------------------------------------------------------

def kernel_summary(key: CacheKey) -> dict[str, str]:
    """What a key is for, as short strings: kind, op, shape, dtype, gpu (empty when unknown)."""
    ir, shapes, gpu = key.kernel_ir, key.shapes, key.gpu_profile
    op = ""
    if isinstance(ir, Mapping):
        op = str(ir.get("kind") or ir.get("name") or "")
    sizes = shapes.get("sizes") if isinstance(shapes, Mapping) and "sizes" in shapes else shapes
    if isinstance(sizes, Mapping):
        shape = " ".join(f"{k}={render_value(v, 40)}" for k, v in sizes.items())
    elif sizes in ({}, [], None):
        shape = ""
    else:
        shape = render_value(sizes, 60)
    dtypes = key.dtypes
    if isinstance(dtypes, Mapping):
        dtype = ",".join(f"{k}:{v}" for k, v in dtypes.items())
    elif isinstance(dtypes, (list, tuple)):
        dtype = ",".join(str(d) for d in dtypes)
    else:
        dtype = "" if dtypes is None else str(dtypes)
    where = ""
    if isinstance(gpu, Mapping):
        where = str(gpu.get("name") or gpu.get("arch") or "")
    return {"kind": key.kind, "op": op, "shape": shape, "dtype": dtype, "gpu": where}


def describe(key: CacheKey) -> str:
    """One line naming the kernel: `tuned-kernel matmul M=64 N=64 K=64 float16,float16 H100`."""
    s = kernel_summary(key)
    return " ".join(v for v in (s["kind"], s["op"], s["shape"], s["dtype"], s["gpu"]) if v)


# --- keys the user types -----------------------------------------------------------------------

def resolve_key(local: LocalStore, text: str) -> str:
    """The full key for `text`: itself when it is 64 hex characters (it may then be a record only
    the remote holds), else the one local record whose key starts with it.

    Raises `InvalidDigestError` for something that is not lowercase hex of 4 to 64 characters,
    `AmbiguousKeyError` when the prefix matches several records, `CacheError` when it matches none.
    """
    if is_digest(text):
        return text
    if not isinstance(text, str) or not MIN_PREFIX <= len(text) < DIGEST_LEN or not _HEX.fullmatch(text):
        raise InvalidDigestError(
            f"invalid key {shorten(text)}: give the 64-hex key or a unique prefix of it "
            f"({MIN_PREFIX} to {DIGEST_LEN} lowercase hex characters)")
    matches = local.keys_with_prefix(text, limit=11)
    if not matches:
        raise CacheError(f"no record in the local cache has a key starting with {text} (the remote cannot be "
                         "searched by prefix: give all 64 characters to look there)")
    if len(matches) > 1:
        shown = ", ".join(matches[:10]) + (", …" if len(matches) > 10 else "")
        more = " or more" if len(matches) > 10 else ""
        raise AmbiguousKeyError(f"key prefix {text} is ambiguous: {len(matches)}{more} stored keys start with it "
                                f"({shown}); give more characters")
    return matches[0]


# --- the nearest stored key --------------------------------------------------------------------

@dataclass(frozen=True)
class Neighbour:
    """The stored record nearest a key, and every field where the two differ (key on the left)."""

    record: Record
    diffs: list[PartDiff]

    @property
    def parts(self) -> list[str]:
        return sorted({d.path.split(".", 1)[0] for d in self.diffs})


class Neighbours:
    """The records of a store, loaded once, searched for the one nearest a given key. Each
    record's kind, op and canonical parts are worked out once, on the first search: the tuner
    asks for a neighbour of every job it measures."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = list(records)
        self._groups: dict[tuple[str, str], list[tuple[Record, dict[str, bytes]]]] | None = None

    @classmethod
    def of(cls, local: LocalStore) -> "Neighbours":
        return cls(local.records())

    def _group(self, kind: str, op: str) -> list[tuple[Record, dict[str, bytes]]]:
        """The records of one kind and op, each with its parts' canonical bytes."""
        if self._groups is None:
            groups: dict[tuple[str, str], list[tuple[Record, dict[str, bytes]]]] = {}
            for record in self.records:
                k = record.key
                groups.setdefault((k.kind, kernel_summary(k)["op"]), []).append(
                    (record, {n: canonical_json(v) for n, v in k.parts().items()}))
            self._groups = groups
        return self._groups.get((kind, op), [])

    def nearest(self, key: CacheKey, *, measured_only: bool = True) -> Neighbour | None:
        """Among records of the same `kind` and op, other than `key` itself, the one sharing the
        most parts with `key` (then the fewest differing fields, then the smallest key); None if
        there is no such record. Predicted records are left out unless `measured_only` is off."""
        mine = {n: canonical_json(v) for n, v in key.parts().items()}
        best: tuple[tuple, Neighbour] | None = None
        for record, parts in self._group(key.kind, kernel_summary(key)["op"]):
            other = record.key
            if other.digest == key.digest or (measured_only and record.predicted):
                continue
            equal = sum(mine[n] == v for n, v in parts.items())
            if best is not None and -equal > best[0][0]:
                continue            # fewer equal parts: it cannot rank first (diffing it costs the most)
            diffs = diff_keys(key, other)
            rank = (-equal, len(diffs), other.digest)
            if best is None or rank < best[0]:
                best = (rank, Neighbour(record, diffs))
        return None if best is None else best[1]


def diff_lines(diffs: list[PartDiff], indent: str = "  ", limit: int | None = None) -> list[str]:
    """`path:` / `- left` / `+ right` for each difference (at most `limit`, then a count)."""
    shown = diffs if limit is None else diffs[:limit]
    lines = []
    for d in shown:
        lines += [f"{indent}{d.path}:", f"{indent}  - {render_value(d.left)}", f"{indent}  + {render_value(d.right)}"]
    if len(shown) < len(diffs):
        lines.append(f"{indent}… and {len(diffs) - len(shown)} more fields")
    return lines


def miss_report(key: CacheKey, neighbours: Neighbours, stored: Record | None = None) -> list[str]:
    """Lines explaining a miss of `key`: the full key and what it is for, its parts, whether a
    prediction sits under it (`stored`), and how the nearest stored key differs from it."""
    lines = [f"key {key.digest} ({describe(key)})", "  parts:"]
    lines += [f"    {name}: {render_value(value)}" for name, value in key.parts().items()]
    if stored is not None and stored.predicted:
        lines.append("  stored under this key: a predicted winner only (the cost model's pick, never a hit)")
    near = neighbours.nearest(key)
    if near is None:
        lines.append(f"  no measured record of the same kind ({describe_kind(key)}) is stored to compare with")
        return lines
    lines.append(f"  nearest stored key {near.record.digest} differs in: {', '.join(near.parts)} "
                 f"(- this key, + stored)")
    lines += diff_lines(near.diffs, "    ", SHOWN_DIFFS)
    return lines


def describe_kind(key: CacheKey) -> str:
    op = kernel_summary(key)["op"]
    return f"{key.kind} {op}" if op else key.kind
