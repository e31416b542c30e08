"""Size-bounded garbage collection of the local store, least recently used first.

Records and blobs share one LRU order (their `last_access`, updated on every read). Evicting a
record leaves its blobs to age out on their own; evicting a blob also evicts the records that name
it, since a record is useless without its blobs. Index rows go first, in one transaction per
victim, and the file after, so a concurrent reader sees a clean miss, never a half-removed entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from xgbuild.cache.errors import CacheError, StoreFullError, shorten
from xgbuild.cache.local import LocalStore

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:iB|B)?|B?)", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """`123` -> 123 bytes; `500K`, `10M`, `1G`, `2T` (binary multiples; `MB`/`MiB` accepted too)."""
    match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if not match:
        raise CacheError(f"invalid size {shorten(text)}: use a number of bytes, or e.g. 500K, 10M, 1G")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    return int(number * _UNITS[unit])


def format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class GcReport:
    removed_records: int
    removed_blobs: int
    freed_bytes: int
    bytes_before: int
    bytes_after: int
    temp_removed: int


def collect(store: LocalStore, max_bytes: int,
            progress: Callable[[int, int], None] | None = None) -> GcReport:
    """Evict least recently used entries until the store holds at most `max_bytes` on disk."""
    if max_bytes < 0:
        raise CacheError(f"--max-size must not be negative, got {max_bytes}")
    temp_removed = store.files.clean_temp()
    before = store.totals().bytes
    excess = before - max_bytes
    removed_records = removed_blobs = freed = 0
    postponed: list[str] = []
    if excess > 0:
        gone: set[str] = set()
        victims = list(store.entries())
        for i, entry in enumerate(victims):
            if freed >= excess:
                break
            if entry.name in gone:
                continue
            if entry.kind == "ac":
                try:
                    store.delete_record(entry.name)
                except StoreFullError:
                    # Deleting a row needs room in the log; blob files evicted next make it.
                    postponed.append(entry.name)
                    continue
                removed_records += 1
                freed += entry.stored_size
                gone.add(entry.name)
            else:
                dependents = store.dependents(entry.name)
                store.delete_blob(entry.name)
                removed_blobs += 1
                freed += entry.stored_size
                gone.add(entry.name)
                for key, size in dependents:
                    if key not in gone:
                        removed_records += 1
                        freed += size
                        gone.add(key)
            if progress:
                progress(i + 1, len(victims))
    for key in postponed:
        if store.contains("ac", key):
            store.delete_record(key)
            removed_records += 1
    store.checkpoint()
    after = store.totals().bytes
    return GcReport(removed_records, removed_blobs, before - after, before, after, temp_removed)
