"""`verify`: rehash every blob, re-check every record, and bring index and files back in step.

Whatever fails is dropped (so the next run is clean) and listed in a `VerifyReport`:

- corrupt: a blob file that does not decompress or hash to its name, a foreign file in `cas/`,
  a record that does not decode to its key;
- missing: an indexed blob whose file is gone (its records go with it);
- dangling: a record naming a blob that is gone.

Harmless leftovers of a crash are repaired without counting as problems: a complete blob file
without an index row is indexed, and temp files of dead writers are removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from xgbuild.cache.blobfiles import BlobFiles
from xgbuild.cache.errors import CorruptEntryError
from xgbuild.cache.index import Index
from xgbuild.cache.records import decode_record


class Verifiable(Protocol):
    """What `verify_store` needs of a store: local.py's LocalStore, its caller, which this module
    therefore names only as this Protocol (importing it would be a cycle)."""

    files: BlobFiles
    index: Index

    def touch_blob(self, digest: str, size: int) -> bool: ...
    def drop_corrupt_blob(self, digest: str) -> None: ...
    def drop_index_rows(self, digest: str) -> None: ...
    def delete_record(self, key: str, corrupt: bool = False) -> None: ...


@dataclass
class VerifyReport:
    """What `verify` found; `ok` is False if anything was corrupt or missing."""

    blobs_checked: int = 0
    records_checked: int = 0
    corrupt: list[str] = field(default_factory=list)      # "cas <digest>: why" / "ac <key>: why"
    missing: list[str] = field(default_factory=list)      # indexed, but the file is gone
    dangling: list[str] = field(default_factory=list)     # records naming a blob that is gone
    repaired: list[str] = field(default_factory=list)     # harmless fixes (orphans adopted)
    temp_removed: int = 0
    index_ok: bool = True

    @property
    def ok(self) -> bool:
        return self.index_ok and not (self.corrupt or self.missing or self.dangling)


def verify_store(store: Verifiable, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Rehash every blob, re-check every record, reconcile index and files; drop what is bad."""
    report = VerifyReport()
    report.temp_removed = store.files.clean_temp()
    files = list(store.files.walk())
    records = store.index.query("SELECT key, record FROM actions")
    total, done = len(files) + len(records), 0
    indexed = {d: s for d, s in store.index.query("SELECT digest, size FROM blobs")}
    present: set[str] = set()
    for name, path in files:
        done += 1
        if progress:
            progress(done, total)
        if store.files.misplaced(name, path):
            path.unlink(missing_ok=True)
            report.corrupt.append(f"cas {name[:80]}: unexpected file in the blob tree, removed")
            continue
        report.blobs_checked += 1
        try:
            size = store.files.copy_out(name, _NullSink())
        except CorruptEntryError as exc:
            store.drop_corrupt_blob(name)
            report.corrupt.append(f"cas {name}: {exc}")
            continue
        if size is None:
            continue   # removed since the listing (a concurrent gc)
        present.add(name)
        if indexed.get(name) != size:
            store.touch_blob(name, size)
            report.repaired.append(f"cas {name}: " + ("indexed" if name not in indexed else "size fixed"))
    for digest in indexed:
        if digest not in present and not store.files.exists(digest):
            store.drop_index_rows(digest)
            report.missing.append(f"cas {digest}: indexed but its file is gone")
    for key, text in records:
        done += 1
        report.records_checked += 1
        _verify_record(store, key, text, report)
        if progress:
            progress(done, total)
    integrity = store.index.query("PRAGMA quick_check")
    report.index_ok = [tuple(r) for r in integrity] == [("ok",)]
    return report


def _verify_record(store: Verifiable, key: str, text: str, report: VerifyReport) -> None:
    try:
        record = decode_record(text.encode("ascii", "replace"), key)
    except CorruptEntryError as exc:
        store.delete_record(key, corrupt=True)
        report.corrupt.append(f"ac {key}: {exc}")
        return
    gone = [f"{n} ({r.digest})" for n, r in record.blobs.items() if not store.files.exists(r.digest)]
    if gone:
        if store.index.query("SELECT 1 FROM actions WHERE key = ?", [key]):
            store.delete_record(key)
            report.dangling.append(f"ac {key}: names missing blobs {', '.join(gone)}")


class _NullSink:
    def write(self, chunk: bytes) -> int:
        return len(chunk)
