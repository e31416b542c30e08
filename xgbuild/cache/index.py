"""The local store's SQLite index: schema, connection, transactions and counters.

One file, `index.sqlite`, in WAL mode so readers never block the writer and many processes can
share it, with a busy timeout so writers queue instead of failing. Every write transaction is
`BEGIN IMMEDIATE`: it takes the write lock up front, because a deferred transaction that reads
and then tries to write can fail at once with SQLITE_BUSY without ever waiting.

Tables (schema version `SCHEMA_VERSION`, kept in `meta`):

    blobs(digest, size, stored_size, created, last_access)     one row a file under cas/
    actions(key, record, size, created, last_access)          key -> record JSON
    action_blobs(key, name, digest)                           which blobs each record names
    stats(name, value)                                        hits, misses, remote errors, ...
    meta(name, value)                                         schema_version

Two degraded modes keep reads working (docs/cache.md): on a full disk, where SQLite cannot size
its shared-memory file (`disk I/O error`), the index is opened with `locking_mode=EXCLUSIVE`, which
keeps the WAL index in process memory (other processes wait for this one); and a cache directory
this process cannot write (a read-only mount, another user's cache) is opened read-only, so
lookups work and every write raises `ReadOnlyStoreError` (bookkeeping skips it).

The index must live on a local disk: SQLite's locking is unreliable on network filesystems, so a
cluster shares results through the remote tier, never by sharing this file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from sqlite_utils import Database

from xgbuild.cache.errors import CacheError, ReadOnlyStoreError, SchemaError, StoreFullError

SCHEMA_VERSION = 1
INDEX_NAME = "index.sqlite"
COUNTERS = (
    "hits", "remote_hits", "misses", "remote_errors", "rejected_downloads",
    "corrupt_dropped", "uploads", "upload_errors",
)


class Index:
    """A process- and thread-safe handle on one cache directory's index."""

    def __init__(self, root: Path, busy_timeout_s: float = 30.0) -> None:
        self.path = root / INDEX_NAME
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._db: Database | None = None
        self._pid = -1
        self.readonly = False           # opened read-only: the directory cannot be written
        self.exclusive = False          # opened without shared memory (a full disk)
        # Connections inherited across fork() are never used or closed by the child: SQLite
        # forbids it. They are parked here so garbage collection cannot close them either.
        self._inherited: list[Database] = []

    # -- connection ------------------------------------------------------------------------

    @property
    def db(self) -> Database:
        return self._ensure()

    def open(self) -> None:
        """Connect now (creating the index if needed) rather than on first use."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> Database:
        if self._db is None or self._pid != os.getpid():
            if self._db is not None:
                self._inherited.append(self._db)
            self._db = self._connect()
            self._pid = os.getpid()
        return self._db

    def _connect(self) -> Database:
        if self.path.exists() and not _writable(self.path):
            return self._open_read_only()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cannot create the cache directory {self.path.parent}: {exc.strerror}") from None
        with self._init_lock():
            try:
                return self._open_and_prepare()
            except _SharedMemoryFull:
                self.exclusive = True
                return self._open_and_prepare()

    def _open_read_only(self) -> Database:
        """The index of a cache this process cannot write: read-only, or (when SQLite cannot
        even read its WAL index without writing) as an immutable file."""
        self.readonly = True
        last: sqlite3.Error | None = None
        for flags in ("mode=ro", "immutable=1"):
            try:
                conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?{flags}", uri=True,
                                       timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                last = exc
                continue
            db = Database(conn)
            try:
                version = self._schema_version(db)
            except sqlite3.Error as exc:
                conn.close()
                last = exc
                continue
            if version != SCHEMA_VERSION:
                conn.close()
                raise self._schema_error(version if version is not None else -1)
            return db
        raise CacheError(f"cannot read the read-only cache index {self.path}: {last}")

    @contextlib.contextmanager
    def _init_lock(self) -> Iterator[None]:
        # Switching a new file to WAL and creating the schema take locks that SQLite may refuse
        # at once (SQLITE_BUSY without waiting, to avoid a deadlock) when several processes open
        # a fresh cache together; an flock serialises just this step.
        lock_path = self.path.with_name(INDEX_NAME + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"no space left for the cache at {self.path.parent}") from None
            raise CacheError(f"cannot open {lock_path}: {exc.strerror}") from None
        try:
            deadline = time.monotonic() + self.busy_timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CacheError(
                            f"another process held {lock_path} for {self.busy_timeout_s:g} s") from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)    # releases the flock

    def _open_and_prepare(self) -> Database:
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout_s, isolation_level=None,
                check_same_thread=False,  # guarded by self._lock instead
            )
        except sqlite3.Error as exc:
            raise self.error(exc) from None
        db = Database(conn)
        try:
            if self.exclusive:
                # Before the first access: SQLite then never maps the -shm file (which a full
                # disk cannot grow), keeping the WAL index in this process's memory.
                db.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise CacheError(
                    f"cannot use WAL mode for {self.path} (got {mode!r}); put the cache on a local disk"
                )
            # NORMAL is safe with WAL: a crash may lose the last commits, never corrupt the file.
            db.execute("PRAGMA synchronous=NORMAL")
            self._ensure_schema(db)
        except sqlite3.Error as exc:
            conn.close()
            if _is_ioerr(exc) and not self.exclusive:
                raise _SharedMemoryFull() from None
            raise self.error(exc) from None
        return db

    def _ensure_schema(self, db: Database) -> None:
        version = self._schema_version(db)
        if version == SCHEMA_VERSION:
            return
        if version is not None and version != SCHEMA_VERSION:
            raise self._schema_error(version)
        db.execute("BEGIN IMMEDIATE")
        try:
            version = self._schema_version(db)   # another process may have just created it
            if version is None:
                self._create_tables(db)
            elif version != SCHEMA_VERSION:
                raise self._schema_error(version)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @staticmethod
    def _schema_version(db: Database) -> int | None:
        if not db["meta"].exists():
            return None
        row = db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        try:
            return int(row[0]) if row else None
        except ValueError:
            return -1

    def _schema_error(self, version: int) -> SchemaError:
        return SchemaError(
            f"the cache index {self.path} has schema version {version}, this XG reads version "
            f"{SCHEMA_VERSION}: use another --cache-dir, or delete that directory"
        )

    @staticmethod
    def _create_tables(db: Database) -> None:
        db["blobs"].create(
            {"digest": str, "size": int, "stored_size": int, "created": float, "last_access": float},
            pk="digest", not_null={"size", "stored_size", "created", "last_access"}, if_not_exists=True,
        )
        db["actions"].create(
            {"key": str, "record": str, "size": int, "created": float, "last_access": float},
            pk="key", not_null={"record", "size", "created", "last_access"}, if_not_exists=True,
        )
        db["action_blobs"].create(
            {"key": str, "name": str, "digest": str},
            pk=("key", "name"), not_null={"digest"}, if_not_exists=True,
        )
        db["action_blobs"].create_index(["digest"], if_not_exists=True)
        db["blobs"].create_index(["last_access"], if_not_exists=True)
        db["actions"].create_index(["last_access"], if_not_exists=True)
        db["stats"].create({"name": str, "value": int}, pk="name", not_null={"value"}, if_not_exists=True)
        db["meta"].create({"name": str, "value": str}, pk="name", not_null={"value"}, if_not_exists=True)
        db.execute(
            "INSERT INTO meta(name, value) VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)]
        )

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None

    # -- queries and transactions ----------------------------------------------------------

    def query(self, sql: str, params: Any = ()) -> list[tuple]:
        with self._lock:
            try:
                return self.db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self.error(exc) from None

    @contextlib.contextmanager
    def write(self) -> Iterator[Database]:
        """A write transaction: all of its statements land, or none do."""
        with self._lock:
            db = self.db
            if self.readonly:
                raise ReadOnlyStoreError(f"the cache at {self.path.parent} is read-only: it is read, but nothing "
                                         "is recorded in it")
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self.error(exc) from None
            try:
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                if db.conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self.error(exc) from None
                raise

    def bump(self, db: Database, counts: dict[str, int]) -> None:
        """Add to named counters inside an open write transaction."""
        for name, n in counts.items():
            if name not in COUNTERS:
                raise ValueError(f"unknown cache counter {name!r}")
            if n:
                db.execute(
                    "INSERT INTO stats(name, value) VALUES (?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                    [name, n],
                )

    def counters(self) -> dict[str, int]:
        values = dict.fromkeys(COUNTERS, 0)
        values.update({name: int(v) for name, v in self.query("SELECT name, value FROM stats")})
        return values

    def error(self, exc: sqlite3.Error) -> CacheError:
        """Turn a SQLite error into a CacheError that says what to do about it."""
        code = getattr(exc, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary == sqlite3.SQLITE_FULL:
            return StoreFullError(
                f"no space left for the cache index {self.path}: free space, or shrink the cache "
                "with `xgbuild cache gc --max-size SIZE`; the index was left unchanged"
            )
        if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return CacheError(
                f"the cache index {self.path} is locked by another process (waited up to "
                f"{self.busy_timeout_s:g} s)"
            )
        if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return CacheError(
                f"the cache index {self.path} is damaged: move it aside and run "
                "`xgbuild cache verify` to rebuild the blob index from the files"
            )
        if primary in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
            return CacheError(f"cannot write the cache index {self.path}: {exc}")
        return CacheError(f"cache index {self.path}: {exc}")


class _SharedMemoryFull(Exception):
    """Opening the index failed with an I/O error (a full disk cannot grow the -shm file)."""


def _is_ioerr(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_IOERR


def _writable(path: Path) -> bool:
    """Whether this process may write the index and create files beside it (-wal, -shm)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
