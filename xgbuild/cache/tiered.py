"""The cache the tuner talks to: the local store in front of an optional remote, plus counters.

Reads fall through local -> remote and fill the local store with what the remote had (after
verifying it). Writes go to the local store, then — unless uploads are off — to the remote, blobs
before the record that names them. The remote can only ever make a build faster: when it is down,
hangs, refuses or errs, this logs ONE warning (through the `xgbuild.cache` logger), counts the
error, and carries on with the local store for the rest of the process; when it serves bytes that
fail verification they are dropped, counted as a rejected download, and the lookup is a miss.

Remote records are untrusted. A record only proves that its key parts hash to its key; whoever
can write the server can write a self-consistent record with any value and blobs. So a remote hit
is handed to its consumer marked `source="remote"` and is NOT copied into the local store; the
consumer checks it (tuner/tuner.py: a winner's config must be a candidate of the job's own search
space; a cubin must equal the one compiled here from the same source) and then `adopt`s it
(origin `remote-verified`) or `reject`s it as poisoned. Every local record says where it came
from in `value["origin"]` (`ORIGINS`); one without a known origin (written by an older XG, which
copied remote records in unchecked) is treated like a remote one.

Counters (hits, remote_hits, misses, remote_errors, rejected_downloads, corrupt_dropped, uploads,
upload_errors) are persisted in the local index, so `xgbuild cache stats` sees every process's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from xgbuild.cache.blobfiles import DigestMismatch
from xgbuild.cache.canonical import JSONValue, thaw
from xgbuild.cache.digests import check_digest
from xgbuild.cache.errors import (CacheError, CorruptEntryError, MissingBlobsError,
                                  ReadOnlyStoreError, RejectedDownloadError, RemoteAuthError,
                                  RemoteUnavailableError, StoreFullError)
from xgbuild.cache.keys import CacheKey
from xgbuild.cache.local import LocalStore
from xgbuild.cache.records import BlobRef, Record, check_blob_name, decode_record
from xgbuild.cache.remote import RemoteStore
from xgbuild.settings import Settings

log = logging.getLogger("xgbuild.cache")

# value["origin"] of a record in the local store: measured here, compiled here, checked against
# this host's own search space or compile, or compiled here after the remote's copy was poisoned.
ORIGINS = {
    "measured": "measured on a GPU of this host",
    "local": "computed on this host",
    "remote-verified": "from the remote, checked here (config in this job's search space, "
                       "or bytes equal to this host's own compile)",
    "re-derived": "compiled here because the remote's record was poisoned",
    "predicted": "the cost model's pick on this host",
}
IN_MEMORY_FILE = 64 << 20     # files up to this size are read once, so upload = what was hashed
HEAD_BEFORE_PUT = 1 << 20     # blobs at least this big are only uploaded if the remote lacks them


@dataclass(frozen=True)
class Artifact:
    """A cache hit: the record and the content of every blob it names, verified."""

    record: Record
    blobs: Mapping[str, bytes]
    source: str                 # "local" or "remote"

    @property
    def origin(self) -> str:
        """Where the record came from (`ORIGINS`), or "remote" / "unknown" for one to check."""
        if self.source != "local":
            return "remote"
        return origin_of(self.record)

    @property
    def trusted(self) -> bool:
        """Whether the record may be used without checking: a local one of known origin."""
        return self.origin in ORIGINS

    @property
    def key(self) -> CacheKey:
        return self.record.key

    @property
    def value(self) -> JSONValue:
        return self.record.value


class Cache:
    """Local store + optional remote tier. Open one per process (`Cache.open(settings)`)."""

    def __init__(self, local: LocalStore, remote: RemoteStore | None = None, *,
                 upload: bool = True) -> None:
        self.local = local
        self.remote = remote
        self.upload = upload
        self.upload_error: str | None = None    # set when an upload was refused (e.g. no token)
        self.poisoned: list[tuple[str, str]] = []   # (key, why) of records rejected this process
        self._warned: set[str] = set()
        self.settings: Settings | None = None

    @classmethod
    def open(cls, settings: Settings) -> "Cache":
        local = LocalStore(settings.cache_dir)
        remote = None
        if settings.remote_cache:
            remote = RemoteStore(settings.remote_cache, header=settings.remote_header_pair,
                                 timeout_s=settings.remote_timeout_s)
        cache = cls(local, remote, upload=settings.remote_upload)
        cache.settings = settings           # what another process (a GPU's measuring one) opens it with
        return cache

    def close(self) -> None:
        self.local.close()
        if self.remote is not None:
            self.remote.close()

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records ---------------------------------------------------------------------------

    def store(self, key: CacheKey, value: JSONValue, blobs: Mapping[str, bytes] | None = None) -> Record:
        """Cache `value` and named `blobs` under `key`, locally and (if enabled) remotely. The
        tuner's values name their origin (`ORIGINS`); one that names none is checked when used."""
        blobs = dict(blobs or {})
        for name in blobs:
            check_blob_name(name)
        record = Record(key, value, {name: self.local.put_blob(data) for name, data in blobs.items()})
        for attempt in range(3):
            try:
                self.local.put_record(record, replace=not record.predicted)
                break
            except MissingBlobsError:
                # A concurrent gc evicted a blob between its write and the record: write it again.
                if attempt == 2:
                    raise
                for data in blobs.values():
                    self.local.put_blob(data)
        if not record.predicted:
            # A prediction stays on this host: uploaded, it could replace a measured winner on
            # the server (a PUT overwrites), and any host can predict it again for nothing.
            self._upload([("cas", ref.digest, blobs[name]) for name, ref in record.blobs.items()]
                         + [("ac", record.digest, record.encode())])
        return record

    def lookup(self, key: CacheKey | str) -> Artifact | None:
        """The record and blobs for `key` from the local store, else the remote; None on a miss.

        A predicted record (see `Record.predicted`) is never a hit: a local one is looked past to
        the remote, whose measured winner then replaces it locally."""
        digest = key.digest if isinstance(key, CacheKey) else check_digest(key, "key")
        hit = self._lookup_local(digest)
        if hit is None and self._readable():
            hit = self._lookup_remote(digest)
        if hit is None:
            self.local.bump(misses=1)
        else:
            self.local.bump(hits=1, remote_hits=int(hit.source == "remote"))
        return hit

    def get_record(self, key: str) -> Record | None:
        """Just the record (no blobs), local first, then remote; for `explain` and `diff` (which
        show predicted records too, marked as such)."""
        check_digest(key, "key")
        try:
            record = self.local.get_record(key)
        except CorruptEntryError as exc:
            self._warn(str(exc))
            record = None
        if record is None and self._readable():
            record = self._remote_record(key)
        return record

    def _lookup_local(self, digest: str) -> Artifact | None:
        try:
            record = self.local.get_record(digest)
        except CorruptEntryError as exc:
            self._warn(str(exc))
            return None
        if record is None or record.predicted:
            return None
        blobs = self._load_blobs(record)
        if blobs is None:
            # The record is useless without its blobs; drop it so it cannot shadow a remote hit.
            self.local.delete_record(digest)
            return None
        return Artifact(record, blobs, "local")

    def _lookup_remote(self, digest: str) -> Artifact | None:
        record = self._remote_record(digest)
        if record is None or record.predicted:
            return None     # a prediction uploaded by some other tool is not a measured winner
        blobs = self._load_blobs(record)
        if blobs is None:
            return None
        # Not copied into the local store: the consumer checks it first (`adopt` / `reject`).
        return Artifact(record, blobs, "remote")

    def adopt(self, hit: Artifact, origin: str = "remote-verified") -> None:
        """Keep a checked hit in the local store, marked with its `origin`."""
        if hit.trusted and hit.origin == origin:
            return
        value = thaw(hit.record.value)
        if isinstance(value, dict):
            value["origin"] = origin
        try:
            self._fill(self.local.put_record, Record(hit.record.key, value, hit.record.blobs))
        except (MissingBlobsError, CacheError) as exc:
            self._warn(f"could not keep checked record {hit.key.digest} locally: {exc}")

    def reject(self, hit: Artifact, why: str) -> None:
        """Drop a hit whose content failed its consumer's check: count it, report the key as
        poisoned (once), and delete a local copy so it cannot be served again."""
        key = hit.key.digest
        self.poisoned.append((key, why))
        self.local.bump(rejected_downloads=1)
        where = f"remote {self.remote.url}" if hit.source == "remote" and self.remote else f"{hit.source} cache"
        log.warning("poisoned cache record %s from the %s: %s; rejected, not used", key, where, why)
        if hit.source == "local":
            try:
                self.local.delete_record(key, corrupt=True)
            except CacheError:
                pass

    def _remote_record(self, key: str) -> Record | None:
        data = self._remote_get("ac", key)
        return None if data is None else decode_record(data, key)

    def _load_blobs(self, record: Record) -> dict[str, bytes] | None:
        out = {}
        for name, ref in record.blobs.items():
            data, _ = self._blob(ref)
            if data is None:
                return None
            out[name] = data
        return out

    # -- blobs -----------------------------------------------------------------------------

    def put_blob(self, data: bytes) -> str:
        ref = self.local.put_blob(data)
        self._upload([("cas", ref.digest, data)])
        return ref.digest

    def get_blob(self, digest: str) -> bytes | None:
        data, remote = self._blob(BlobRef(check_digest(digest), 0), size_known=False)
        self.local.bump(hits=int(data is not None), misses=int(data is None), remote_hits=int(remote))
        return data

    def put_file(self, path: Path | str) -> str:
        """Store a file's content (streaming if large) and upload it; returns its sha256."""
        path = Path(path)
        if path.stat().st_size <= IN_MEMORY_FILE:
            return self.put_blob(path.read_bytes())
        ref = self.local.put_file(path)
        if self._writable():
            try:
                if not self.remote.contains("cas", ref.digest):
                    self.remote.put_file(ref.digest, path)
                self.local.bump(uploads=1)
            except (RemoteUnavailableError, RemoteAuthError) as exc:
                self._remote_failed(exc, upload=True)
        return ref.digest

    def get_file(self, digest: str, out: Path | str) -> bool:
        """Write a blob to `out` (verified, atomically), fetching it from the remote if needed."""
        check_digest(digest)
        try:
            found = self.local.get_file(digest, out)
        except CorruptEntryError as exc:
            self._warn(f"{exc}; refetching" if self._readable() else str(exc))
            found = False
        remote_hit = False
        if not found and self._readable():
            found = remote_hit = self._fetch_streaming(digest) and self.local.get_file(digest, out)
        self.local.bump(hits=int(found), misses=int(not found), remote_hits=int(remote_hit))
        return found

    def _fetch_streaming(self, digest: str) -> bool:
        try:
            ref = self.local.ingest_from(lambda write: self.remote.download_blob(digest, write), digest)
        except DigestMismatch as exc:
            self._rejected(f"remote {self.remote.url} returned {exc.size} bytes for blob {digest} "
                           f"that hash to {exc.actual}")
            return False
        except RejectedDownloadError as exc:
            self._rejected(str(exc))
            return False
        except (RemoteUnavailableError, RemoteAuthError) as exc:
            self._remote_failed(exc)
            return False
        except (StoreFullError, ReadOnlyStoreError) as exc:
            self._warn(f"{exc}; remote hits are not being kept locally")
            return False
        return ref is not None

    def _blob(self, ref: BlobRef, size_known: bool = True) -> tuple[bytes | None, bool]:
        """(content, came from the remote); content is None if neither tier has it."""
        try:
            data = self.local.get_blob(ref.digest, ref.size if size_known else None)
        except CorruptEntryError as exc:
            self._warn(f"{exc}; refetching" if self._readable() else str(exc))
            data = None
        if data is not None:
            return data, False
        data = self._remote_get("cas", ref.digest, ref.size if size_known else None)
        if data is not None:
            self._fill(self.local.put_blob, data)
        return data, data is not None

    def _fill(self, put, *args) -> None:
        # Copying a remote hit into the local store is an optimisation: a full disk must not
        # turn a verified hit into an error.
        try:
            put(*args)
        except (StoreFullError, ReadOnlyStoreError) as exc:
            self._warn(f"{exc}; remote hits are not being kept locally")

    # -- the remote, and what to do when it misbehaves -------------------------------------

    def _readable(self) -> bool:
        return self.remote is not None and self.remote.available

    def _writable(self) -> bool:
        return (self.upload and self._readable() and self.upload_error is None
                and not self.remote.uploads_refused)

    def _remote_get(self, kind: str, name: str, limit: int | None = None) -> bytes | None:
        if not self._readable():
            return None
        try:
            return self.remote.get(kind, name, limit)
        except RejectedDownloadError as exc:
            self._rejected(str(exc))
        except (RemoteUnavailableError, RemoteAuthError) as exc:
            self._remote_failed(exc)
        return None

    def _upload(self, items: list[tuple[str, str, bytes]]) -> None:
        if not self._writable():
            return
        try:
            for kind, name, data in items:
                if kind == "cas" and len(data) >= HEAD_BEFORE_PUT and self.remote.contains(kind, name):
                    continue
                self.remote.put(kind, name, data)
            self.local.bump(uploads=1)
        except (RemoteUnavailableError, RemoteAuthError) as exc:
            self._remote_failed(exc, upload=True)

    def _remote_failed(self, exc: CacheError, upload: bool = False) -> None:
        self.local.bump(remote_errors=1, upload_errors=int(upload))
        if upload:
            self.upload_error = str(exc)
        if self.remote.available:
            # Only uploads were refused (no token): reads still go to the remote.
            self._warn(f"{exc}; stored locally only")
        else:
            self._warn(f"{exc}; continuing with the local cache only for this run")

    def _rejected(self, message: str) -> None:
        self.local.bump(rejected_downloads=1)
        log.warning("%s; rejected, not used", message)

    def _warn(self, message: str) -> None:
        # One warning per distinct message: a dead remote is reported once, not once per lookup.
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    # -- numbers ---------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        totals = self.local.totals()
        out: dict[str, object] = {
            "cache_dir": str(self.local.root),
            "entries": totals.blobs + totals.records,
            "blobs": totals.blobs,
            "records": totals.records,
            "bytes": totals.bytes,
            "raw_bytes": totals.raw_bytes,
        }
        out.update(self.local.counters())
        out["remote"] = self.remote.url if self.remote else None
        return out



def origin_of(record: Record) -> str:
    """A local record's origin (`ORIGINS`), from its value; "unknown" when it names none."""
    value = record.value
    if not isinstance(value, Mapping):
        return "unknown"
    origin = value.get("origin")
    if origin is None and value.get("how") == "predicted":
        return "predicted"
    return origin if isinstance(origin, str) and origin in ORIGINS else "unknown"
