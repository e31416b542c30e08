"""Blob files: the `cas/<ab>/<sha256>` tree of zstd-compressed content, written atomically.

Layout under the cache directory:

    cas/ab/ab12…ef    zstd frame of the blob whose sha256 is ab12…ef
    tmp/<pid>-*.part  files being written (never read as blobs)

A write compresses into a temp file in `tmp/` (same filesystem), fsyncs it, and `os.replace`s it
into place, then fsyncs the directory: a reader — or a process killed mid-write — sees either no
blob or the whole blob, never part of one. A read decompresses and re-hashes; a mismatch means the
disk changed the bytes, so the file is removed and `CorruptEntryError` raised, never wrong bytes.

This module knows nothing about the SQLite index; `local.LocalStore` keeps the two in step.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, NoReturn

import zstandard

from xgbuild.cache.digests import CHUNK, check_digest, is_digest
from xgbuild.cache.errors import CorruptEntryError, InvalidDigestError, StoreFullError

ZSTD_LEVEL = 3
STALE_TEMP_S = 24 * 3600    # a temp file this old belongs to a writer that is certainly gone
MAX_IN_MEMORY = 1 << 32     # `read_bytes` refuses frames claiming more; stream those instead
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; without it a power cut can forget a completed write.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def full_error(exc: OSError, where: Path) -> StoreFullError:
    return StoreFullError(
        f"no space left for the cache at {where} ({os.strerror(exc.errno or 0).lower()}): "
        "free space, or shrink it with `xgbuild cache gc --max-size SIZE`; nothing partial was kept"
    )


class DigestMismatch(Exception):
    """Streamed content did not hash to the digest it was announced under (nothing was kept)."""

    def __init__(self, expected: str, actual: str, size: int) -> None:
        super().__init__(f"expected {expected}, got {actual} ({size} bytes)")
        self.expected, self.actual, self.size = expected, actual, size


class BlobFiles:
    """The content-addressed files of one cache directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cas = root / "cas"
        self.tmp = root / "tmp"

    def path(self, digest: str) -> Path:
        check_digest(digest)   # before the value becomes part of a path
        return self.cas / digest[:2] / digest

    # -- writing ---------------------------------------------------------------------------

    def write_bytes(self, digest: str, data: bytes) -> int:
        """Store `data` (already hashed to `digest` by the caller); returns the stored size."""
        frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
        self._atomic_write(self.path(digest), lambda f: f.write(frame))
        return len(frame)

    def writer(self, expected: str | None = None, size: int | None = None) -> "BlobWriter":
        """A streaming writer into the store (see `BlobWriter`)."""
        return BlobWriter(self, expected, size)

    def write_stream(self, chunks: Iterable[bytes], expected: str | None = None,
                     size: int | None = None) -> tuple[str, int, int]:
        """Compress a stream into the store; returns (digest, size, stored size)."""
        with self.writer(expected, size) as w:
            for chunk in chunks:
                w.write(chunk)
            return w.commit()

    def _atomic_write(self, final: Path, fill: Callable[[BinaryIO], object]) -> None:
        fd, tmp = self._temp()
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                self._publish(f, tmp, final)
        except BaseException as exc:
            _unlink_quietly(tmp)
            if _is_full(exc):
                raise full_error(exc, self.root) from None
            raise

    def _temp(self) -> tuple[int, str]:
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)
            return tempfile.mkstemp(dir=self.tmp, prefix=f"{os.getpid()}-", suffix=".part")
        except OSError as exc:
            if _is_full(exc):
                raise full_error(exc, self.root) from None
            raise

    @staticmethod
    def _publish(f: BinaryIO, tmp: str, final: Path) -> None:
        f.flush()
        os.fsync(f.fileno())
        final.parent.mkdir(parents=True, exist_ok=True)
        # Atomic within one filesystem: the blob appears complete or not at all.
        os.replace(tmp, final)
        fsync_dir(final.parent)

    # -- reading ---------------------------------------------------------------------------

    def read_bytes(self, digest: str, size: int | None = None) -> bytes | None:
        """The verified content of a blob, or None if absent; `CorruptEntryError` if damaged."""
        path = self.path(digest)
        try:
            with open(path, "rb") as f:
                frame = f.read()
        except FileNotFoundError:
            return None
        try:
            claimed = zstandard.frame_content_size(frame)
        except zstandard.ZstdError:
            self._drop_corrupt(path, digest, "is not a zstd frame")
        if claimed < 0 or claimed > MAX_IN_MEMORY:
            return self._read_streaming(path, digest)
        if size is not None and claimed != size:
            self._drop_corrupt(path, digest, f"claims {claimed} bytes, the index says {size}")
        try:
            data = zstandard.ZstdDecompressor().decompress(frame)
        except zstandard.ZstdError:
            self._drop_corrupt(path, digest, "does not decompress")
        if hashlib.sha256(data).hexdigest() != digest:
            self._drop_corrupt(path, digest, "does not hash to its name")
        return data

    def _read_streaming(self, path: Path, digest: str) -> bytes:
        parts: list[bytes] = []
        self.copy_out(digest, _ListSink(parts))
        return b"".join(parts)

    def copy_out(self, digest: str, sink: BinaryIO) -> int | None:
        """Stream a blob's content into `sink`, verifying it; returns the size, None if absent.

        On a mismatch `sink` has received unverified bytes: callers write to a temp file and only
        rename it into place after this returns.
        """
        path = self.path(digest)
        h = hashlib.sha256()
        size = 0
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return None
        try:
            with f, zstandard.ZstdDecompressor().stream_reader(f) as reader:
                while chunk := reader.read(CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    sink.write(chunk)
        except zstandard.ZstdError:
            self._drop_corrupt(path, digest, "does not decompress")
        if h.hexdigest() != digest:
            self._drop_corrupt(path, digest, "does not hash to its name")
        return size

    def _drop_corrupt(self, path: Path, digest: str, why: str) -> NoReturn:
        # Removed, not kept aside: the content is addressable again from any good copy, and a
        # damaged file left in place would fail every future read the same way.
        _unlink_quietly(path)
        raise CorruptEntryError(f"blob {digest} {why}; it was dropped from the local cache")

    # -- housekeeping ----------------------------------------------------------------------

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def stored_size(self, digest: str) -> int | None:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def remove(self, digest: str) -> None:
        _unlink_quietly(self.path(digest))

    def walk(self) -> Iterator[tuple[str, Path]]:
        """Every file under `cas/` as (name, path); names that are not digests come back as-is."""
        if not self.cas.is_dir():
            return
        for sub in sorted(self.cas.iterdir()):
            if not sub.is_dir():
                yield sub.name, sub
                continue
            for path in sorted(sub.iterdir()):
                yield path.name, path

    def misplaced(self, name: str, path: Path) -> bool:
        """True for a file in `cas/` that is not at the path its name calls for."""
        if not is_digest(name):
            return True
        try:
            return self.path(name) != path
        except InvalidDigestError:
            return True

    def clean_temp(self, now: float | None = None) -> int:
        """Remove temp files left by writers that died; returns how many were removed."""
        if not self.tmp.is_dir():
            return 0
        now = time.time() if now is None else now
        removed = 0
        for path in self.tmp.iterdir():
            pid_text = path.name.split("-", 1)[0]
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if age > STALE_TEMP_S or (pid_text.isdigit() and not _pid_alive(int(pid_text))):
                _unlink_quietly(path)
                removed += 1
        return removed


class BlobWriter:
    """Streams content into a temp file, compressing and hashing it; `commit` publishes it.

    Use as a context manager: leaving the block without `commit` (or by an exception) removes the
    temp file, so nothing is ever published unverified. With `expected`, `commit` raises
    `DigestMismatch` if the content hashes otherwise.
    """

    def __init__(self, files: BlobFiles, expected: str | None, size: int | None) -> None:
        if expected is not None:
            check_digest(expected)
        self._files, self._expected = files, expected
        self._fd, self._tmp = files._temp()
        self._f = os.fdopen(self._fd, "wb")
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self._z = cctx.stream_writer(self._f, size=-1 if size is None else size, closefd=False)
        self._h = hashlib.sha256()
        self.size = 0
        self._done = False

    def write(self, chunk: bytes) -> int:
        self._h.update(chunk)
        self.size += len(chunk)
        try:
            self._z.write(chunk)
        except OSError as exc:
            self.abort()
            if _is_full(exc):
                raise full_error(exc, self._files.root) from None
            raise
        return len(chunk)

    def commit(self) -> tuple[str, int, int]:
        """Verify and publish; returns (digest, size, stored size)."""
        actual = self._h.hexdigest()
        if self._expected is not None and actual != self._expected:
            self.abort()
            raise DigestMismatch(self._expected, actual, self.size)
        try:
            self._z.close()       # ends the zstd frame; the file stays open (closefd=False)
            stored = self._f.tell()
            self._files._publish(self._f, self._tmp, self._files.path(actual))
            self._f.close()
        except zstandard.ZstdError:
            # The frame's pledged size disagreed with the content: treat it as a bad download.
            self.abort()
            raise DigestMismatch(self._expected or actual, actual, self.size) from None
        except BaseException as exc:
            self.abort()
            if _is_full(exc):
                raise full_error(exc, self._files.root) from None
            raise
        self._done = True
        return actual, self.size, stored

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._f.close()
        except OSError:
            pass
        _unlink_quietly(self._tmp)

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def _is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL


class _ListSink:
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    def write(self, chunk: bytes) -> int:
        self.parts.append(bytes(chunk))
        return len(chunk)


def _pid_alive(pid: int) -> bool:
    # The cache directory is local (never on a network filesystem), so a pid names a local process.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
