"""The local store: one cache directory, its SQLite index and its blob files, kept consistent.

    <cache_dir>/index.sqlite     the index (see `index`)
    <cache_dir>/cas/ab/<sha256>  zstd blobs (see `blobfiles`)
    <cache_dir>/tmp/             files being written

Ordering is what keeps a crash harmless: a blob's file is renamed into place *before* its index
row is written, and a record is inserted only in a transaction that sees every blob it names. So
a process killed at any instant leaves, at worst, a complete blob file without a row (adopted by
the next read or `verify`) or a temp file (removed by `verify`/`gc`), never a partial blob and
never a record whose blobs are missing.

`LocalStore` implements the `Store` interface (`get`/`put`/`contains` on `cas` and `ac`) plus the
local-only operations: files, listing, totals, verify, and the eviction primitives `gc` uses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from xgbuild.cache.blobfiles import BlobFiles
from xgbuild.cache.digests import CHUNK, check_digest, sha256_bytes
from xgbuild.cache.errors import (CacheError, CorruptEntryError, MissingBlobsError, ReadOnlyStoreError,
                                  StoreFullError)
from xgbuild.cache.index import Index
from xgbuild.cache.records import BlobRef, Record, decode_record
from xgbuild.cache.store import Kind, check_kind
from xgbuild.cache.verify import VerifyReport, verify_store


@dataclass(frozen=True)
class Entry:
    """One stored thing, for `ls` and `gc`: a blob (`cas`) or a record (`ac`)."""

    kind: Kind
    name: str
    size: int            # bytes of content (uncompressed blob, or record JSON)
    stored_size: int     # bytes on disk
    last_access: float


@dataclass(frozen=True)
class Totals:
    blobs: int
    records: int
    bytes: int           # on disk: compressed blobs plus record JSON
    raw_bytes: int       # uncompressed content


class LocalStore:
    """A cache directory on local disk; safe to use from many threads and processes at once."""

    def __init__(self, root: Path | str, *, busy_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.files = BlobFiles(self.root)
        self.index = Index(self.root, busy_timeout_s)
        self.clock = clock
        self.index.open()   # creates the index if needed, so errors surface here and not later
        if self.index.readonly:
            logging.getLogger("xgbuild.cache").warning(
                "the cache at %s is read-only: reading it, nothing will be recorded", self.root)

    def close(self) -> None:
        self.index.close()

    # -- the Store interface ---------------------------------------------------------------

    def get(self, kind: Kind, name: str) -> bytes | None:
        if check_kind(kind) == "cas":
            return self.get_blob(name)
        record = self.get_record(name)
        return None if record is None else record.encode()

    def put(self, kind: Kind, name: str, data: bytes) -> None:
        if check_kind(kind) == "cas":
            check_digest(name)
            if sha256_bytes(data) != name:
                raise CacheError(f"content does not hash to the digest {name} it was put under")
            self.put_blob(data)
        else:
            self.put_record(decode_record(data, name))

    def contains(self, kind: Kind, name: str) -> bool:
        if check_kind(kind) == "cas":
            return self.files.exists(check_digest(name))
        rows = self.index.query("SELECT 1 FROM actions WHERE key = ?", [check_digest(name, "key")])
        return bool(rows)

    # -- blobs -----------------------------------------------------------------------------

    def put_blob(self, data: bytes) -> BlobRef:
        digest = sha256_bytes(data)
        for _ in range(3):
            # Storing it again counts as a use, for the LRU.
            if self._have_blob(digest) and self.touch_blob(digest, len(data)):
                return BlobRef(digest, len(data))
            self._check_writable()
            stored = self.files.write_bytes(digest, data)
            if self._index_blob(digest, len(data), stored):
                return BlobRef(digest, len(data))
        raise CacheError(f"blob {digest} was evicted as fast as it was written: is a gc running "
                         "with a --max-size smaller than one blob?")

    def put_file(self, path: Path | str) -> BlobRef:
        """Store a file's content, streaming (the file may be larger than memory)."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return self.ingest(iter(lambda: f.read(CHUNK), b""), size=size)

    def ingest(self, chunks: Iterable[bytes], expected: str | None = None,
               size: int | None = None) -> BlobRef:
        """Store streamed content; with `expected`, a mismatch raises `DigestMismatch`, keeping nothing."""
        self._check_writable()
        digest, n, stored = self.files.write_stream(chunks, expected, size)
        return self._indexed(digest, n, stored)

    def ingest_from(self, produce: Callable[[Callable[[bytes], object]], bool],
                    expected: str, size: int | None = None) -> BlobRef | None:
        """Let `produce(write)` push chunks (e.g. a download); None if it reports nothing found.

        The content must hash to `expected`, else `DigestMismatch` is raised and nothing is kept.
        """
        self._check_writable()
        with self.files.writer(expected, size) as w:
            if not produce(w.write):
                return None
            digest, n, stored = w.commit()
        return self._indexed(digest, n, stored)

    def _check_writable(self) -> None:
        if self.index.readonly:
            raise ReadOnlyStoreError(f"the cache at {self.root} is read-only: it is read, but nothing is "
                                     "recorded in it")

    def _indexed(self, digest: str, size: int, stored: int) -> BlobRef:
        if not self._index_blob(digest, size, stored):
            raise CacheError(f"blob {digest} was evicted by a concurrent gc while being stored; retry")
        return BlobRef(digest, size)

    def get_blob(self, digest: str, size: int | None = None) -> bytes | None:
        """Verified content, or None; a damaged blob is dropped and `CorruptEntryError` raised."""
        check_digest(digest)
        try:
            data = self.files.read_bytes(digest, size)
        except CorruptEntryError:
            self.drop_corrupt_blob(digest)
            raise
        if data is not None:
            self.touch_blob(digest, len(data))
        return data

    def get_file(self, digest: str, out: Path | str) -> bool:
        """Write a blob's verified content to `out` atomically; False if the blob is absent."""
        check_digest(digest)
        out = Path(out)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            with open(tmp, "wb") as sink:
                size = self._copy_out(digest, sink)
            if size is None:
                os.unlink(tmp)
                return False
            os.replace(tmp, out)
        except BaseException:
            if tmp.exists():
                os.unlink(tmp)
            raise
        self.touch_blob(digest, size)
        return True

    def _copy_out(self, digest: str, sink: BinaryIO) -> int | None:
        try:
            return self.files.copy_out(digest, sink)
        except CorruptEntryError:
            self.drop_corrupt_blob(digest)
            raise

    def _have_blob(self, digest: str) -> bool:
        rows = self.index.query("SELECT 1 FROM blobs WHERE digest = ?", [digest])
        return bool(rows) and self.files.exists(digest)

    def _index_blob(self, digest: str, size: int, stored: int) -> bool:
        """Upsert the blob's row; False (and no row) if its file is gone by the time we hold the lock.

        gc removes files while holding the write lock, so checking under the lock means a row is
        never written for a file that a concurrent gc has just removed.
        """
        now = self.clock()
        with self.index.write() as db:
            if not self.files.exists(digest):
                return False
            db.execute(
                "INSERT INTO blobs(digest, size, stored_size, created, last_access) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(digest) DO UPDATE SET size = excluded.size, "
                "stored_size = excluded.stored_size, last_access = excluded.last_access",
                [digest, size, stored, now, now],
            )
        return True

    def touch_blob(self, digest: str, size: int) -> bool:
        """Mark a blob used now, indexing it if its row is missing; False if its file is gone."""
        stored = self.files.stored_size(digest)
        if stored is None:
            return False
        # An upsert, so a blob whose writer died between rename and index row is adopted here.
        with _best_effort():
            return self._index_blob(digest, size, stored)
        return True     # disk full: the blob is there, only its access time was not recorded

    def drop_corrupt_blob(self, digest: str) -> None:
        """Forget a blob found damaged (and the records naming it); counted in corrupt_dropped."""
        # Best effort: the file is already gone, and an index row without a file reads as a miss.
        with _best_effort(), self.index.write() as db:
            self._drop_blob_rows(db, digest)
            self.index.bump(db, {"corrupt_dropped": 1})

    def drop_index_rows(self, digest: str) -> None:
        """Forget a blob whose file is gone, with the records that name it."""
        with self.index.write() as db:
            self._drop_blob_rows(db, digest)

    @staticmethod
    def _drop_blob_rows(db, digest: str) -> None:
        # Records naming the blob are useless without it: drop them in the same transaction.
        db.execute(
            "DELETE FROM actions WHERE key IN (SELECT key FROM action_blobs WHERE digest = ?)", [digest]
        )
        db.execute(
            "DELETE FROM action_blobs WHERE key IN (SELECT key FROM action_blobs WHERE digest = ?)",
            [digest],
        )
        db.execute("DELETE FROM blobs WHERE digest = ?", [digest])

    # -- records ---------------------------------------------------------------------------

    def put_record(self, record: Record, *, replace: bool = True) -> bool:
        """Insert or replace a record; every blob it names must already be in the store. With
        `replace=False` an existing record under the key is kept (a predicted winner must never
        overwrite a measured one); returns whether the record was written."""
        data = record.encode().decode("ascii")
        now = self.clock()
        with self.index.write() as db:
            if not replace and db.execute("SELECT 1 FROM actions WHERE key = ?", [record.digest]).fetchone():
                return False
            missing = [
                f"{name} ({ref.digest})" for name, ref in record.blobs.items()
                if not db.execute("SELECT 1 FROM blobs WHERE digest = ?", [ref.digest]).fetchone()
            ]
            if missing:
                raise MissingBlobsError(
                    f"record {record.digest} names blobs that are not in the store: {', '.join(missing)}"
                )
            db.execute(
                "INSERT INTO actions(key, record, size, created, last_access) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET record = excluded.record, size = excluded.size, "
                "last_access = excluded.last_access",
                [record.digest, data, len(data), now, now],
            )
            db.execute("DELETE FROM action_blobs WHERE key = ?", [record.digest])
            for name, ref in record.blobs.items():
                db.execute(
                    "INSERT INTO action_blobs(key, name, digest) VALUES (?, ?, ?)",
                    [record.digest, name, ref.digest],
                )
        return True

    def get_record(self, key: str) -> Record | None:
        """The verified record stored under `key`, or None; a damaged one is dropped and raised."""
        check_digest(key, "key")
        rows = self.index.query("SELECT record FROM actions WHERE key = ?", [key])
        if not rows:
            return None
        try:
            record = decode_record(rows[0][0].encode("ascii", "replace"), key)
        except CorruptEntryError:
            self.delete_record(key, corrupt=True)
            raise
        with _best_effort(), self.index.write() as db:
            db.execute("UPDATE actions SET last_access = ? WHERE key = ?", [self.clock(), key])
        return record

    def keys_with_prefix(self, prefix: str, limit: int = 11) -> list[str]:
        """Up to `limit` stored record keys starting with `prefix` (lowercase hex), sorted."""
        # A range over the primary key, not LIKE: `prefix` then never acts as a pattern.
        rows = self.index.query("SELECT key FROM actions WHERE key >= ? AND key < ? ORDER BY key LIMIT ?",
                                [prefix, prefix + "g", limit])
        return [k for (k,) in rows]

    def records(self) -> Iterator[Record]:
        """Every stored record that decodes cleanly (for forensics: `ls`, nearest-key search);
        a damaged one is skipped here and left for a read or `verify` to drop."""
        for key, data in self.index.query("SELECT key, record FROM actions ORDER BY key"):
            try:
                yield decode_record(data.encode("ascii", "replace"), key)
            except CorruptEntryError:
                continue

    def delete_record(self, key: str, corrupt: bool = False) -> None:
        check_digest(key, "key")
        with self.index.write() as db:
            db.execute("DELETE FROM actions WHERE key = ?", [key])
            db.execute("DELETE FROM action_blobs WHERE key = ?", [key])
            if corrupt:
                self.index.bump(db, {"corrupt_dropped": 1})

    def delete_blob(self, digest: str) -> None:
        """Remove a blob and every record naming it."""
        check_digest(digest)
        try:
            self._delete_blob_locked(digest)
        except StoreFullError:
            # No room even to log the deletion: remove the file first to make some, then retry.
            # Meanwhile readers see an indexed blob without a file, which reads as a clean miss.
            self.files.remove(digest)
            self._delete_blob_locked(digest)

    def _delete_blob_locked(self, digest: str) -> None:
        with self.index.write() as db:
            self._drop_blob_rows(db, digest)
            # Removed while holding the write lock: a concurrent put of the same content cannot
            # index its fresh copy in between and be left with a row but no file.
            self.files.remove(digest)

    def checkpoint(self) -> None:
        """Fold the write-ahead log back into the index and truncate it (after a gc)."""
        with _best_effort():
            self.index.query("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- counters, listing, totals ---------------------------------------------------------

    def bump(self, **counts: int) -> None:
        with _best_effort(), self.index.write() as db:
            self.index.bump(db, counts)

    def counters(self) -> dict[str, int]:
        return self.index.counters()

    def entries(self) -> Iterator[Entry]:
        """Every record and blob, least recently used first."""
        rows = self.index.query(
            "SELECT 'ac', key, size, size, last_access FROM actions "
            "UNION ALL SELECT 'cas', digest, size, stored_size, last_access FROM blobs "
            "ORDER BY 5, 1, 2"
        )
        for kind, name, size, stored, last in rows:
            yield Entry(kind, name, int(size), int(stored), float(last))

    def totals(self) -> Totals:
        (blobs, b_bytes, b_raw), = self.index.query(
            "SELECT count(*), coalesce(sum(stored_size), 0), coalesce(sum(size), 0) FROM blobs"
        )
        (records, r_bytes), = self.index.query("SELECT count(*), coalesce(sum(size), 0) FROM actions")
        return Totals(blobs, records, b_bytes + r_bytes, b_raw + r_bytes)

    def dependents(self, digest: str) -> list[tuple[str, int]]:
        """(key, size) of every record that names the blob `digest`."""
        return [(k, int(n)) for k, n in self.index.query(
            "SELECT a.key, a.size FROM actions a JOIN action_blobs b ON a.key = b.key WHERE b.digest = ?",
            [check_digest(digest)],
        )]

    # -- verify ----------------------------------------------------------------------------

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Rehash every blob, re-check every record, reconcile index and files (see `verify`)."""
        return verify_store(self, progress)


@contextlib.contextmanager
def _best_effort() -> Iterator[None]:
    # Access times and counters are bookkeeping: a full disk or a read-only cache must not turn
    # a good read into an error. The transaction rolled back, so the index is unchanged.
    try:
        yield
    except (StoreFullError, ReadOnlyStoreError):
        pass
