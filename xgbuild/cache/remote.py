"""The remote tier: any server speaking the Bazel HTTP cache protocol, over `http.client`.

    GET|HEAD|PUT <url>/cas/<sha256>   blobs, raw bytes, addressed by the sha256 of their content
    GET|HEAD|PUT <url>/ac/<key>       records (XG's self-verifying JSON, see `records`)

So one server — nginx with WebDAV, bazel-remote (with `--disable_http_ac_validation`, since XG's
records are not Bazel ActionResults), or a hosted Bazel cache — serves Bazel and XG alike.

Nothing from the remote is trusted: a blob must hash to its digest and a record must decode and
hash to its key, or `RejectedDownloadError` is raised and the bytes are dropped. Downloads are
size-capped, so a hostile server cannot exhaust memory.

Every request has one deadline for all of it — connect, send, status line and headers, body:
`timeout_s`, plus a second per MiB actually sent or received (`MIN_RATE`), so a large blob may take
its time but a server that trickles its headers or body a byte at a time cannot stall a build past
the timeout. Each socket read waits at most the time left (`_DeadlineSocket`). A body that ends
before its declared length is a *transfer interrupted*, never mistaken for wrong bytes.

Failure policy (a circuit breaker): the first time the server is down, refuses the connection,
hangs past the timeout, answers 5xx or refuses reads, `RemoteUnavailableError` is raised and the
store marks itself `down`; every later call fails at once without touching the network, so a dead
remote costs one timeout per process, not one per lookup. A PUT refused for lack of credentials
(401/403) raises `RemoteAuthError` and turns uploads off for this process; reads go on.
"""

from __future__ import annotations

import http.client
import io
import os
import re
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable
from urllib.parse import urlsplit

from xgbuild.cache.digests import CHUNK, check_digest, sha256_bytes
from xgbuild.cache.errors import (CorruptEntryError, RejectedDownloadError, RemoteAuthError,
                                  RemoteConfigError, RemoteUnavailableError, shorten)
from xgbuild.cache.records import MAX_RECORD_BYTES, decode_record
from xgbuild.cache.store import Kind, check_kind

MAX_BLOB_BYTES = 1 << 34        # 16 GiB: refuse to stream anything claiming more
MAX_IN_MEMORY = 1 << 30         # `get` of a blob of unknown size holds at most 1 GiB in memory
MIN_RATE = 1 << 20              # bytes/s: a body slower than this counts as a hung server
_PATH_CHARS = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/%-]*")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")   # an HTTP header name (RFC 9110 token)
TOKEN_HINT = ("uploads need a token: set XG_REMOTE_CACHE_HEADER='Authorization: Bearer <token>' "
              "(or --remote-header), or pass --no-remote-upload to only read")
_RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
              http.client.CannotSendRequest)


def check_header(header: tuple[str, str] | None) -> tuple[str, str] | None:
    """Refuse a header that could inject another header or request line."""
    if header is None:
        return None
    name, value = header
    if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0") or not value.strip():
        raise RemoteConfigError(f"invalid remote cache header {shorten(name)}: expected 'Name: value'")
    return name, value


class RemoteStore:
    """A Bazel HTTP cache at `url`; see the module docstring for what it checks and tolerates."""

    def __init__(self, url: str, *, header: tuple[str, str] | None = None,
                 timeout_s: float = 10.0) -> None:
        parts = urlsplit(url.strip()) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteConfigError(f"remote cache URL {shorten(url)} must look like http://host[:port][/path]")
        if parts.username or parts.password:
            raise RemoteConfigError("put remote cache credentials in XG_REMOTE_CACHE_HEADER, not in the URL")
        if parts.query or parts.fragment or not _PATH_CHARS.fullmatch(parts.path):
            raise RemoteConfigError(
                f"remote cache URL {shorten(url)} may not carry a query, fragment or spaces")
        try:
            port = parts.port
        except ValueError:
            raise RemoteConfigError(f"remote cache URL {shorten(url)} has an invalid port") from None
        if not timeout_s > 0:
            raise RemoteConfigError(f"remote timeout must be positive, got {timeout_s!r}")
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, port
        self._base = parts.path.rstrip("/")
        self._header = check_header(header)
        self.timeout_s = float(timeout_s)
        self.down: str | None = None              # why the remote is off for this process
        self.uploads_refused: str | None = None   # why uploads are off for this process
        self._local = threading.local()

    @property
    def available(self) -> bool:
        return self.down is None

    # -- the Store interface ---------------------------------------------------------------

    def get(self, kind: Kind, name: str, limit: int | None = None) -> bytes | None:
        """Verified bytes, None on 404; raises Rejected/Unavailable/Auth errors as documented."""
        kind = check_kind(kind)
        check_digest(name, "digest" if kind == "cas" else "key")
        cap = MAX_RECORD_BYTES if kind == "ac" else (limit or MAX_IN_MEMORY)
        parts: list[bytes] = []
        if not self._download(kind, name, cap, parts.append):
            return None
        data = b"".join(parts)
        if kind == "cas":
            actual = sha256_bytes(data)
            if actual != name:
                raise RejectedDownloadError(
                    f"remote {self.url} returned {len(data)} bytes for blob {name} that hash to {actual}"
                )
        else:
            try:
                decode_record(data, name)
            except CorruptEntryError as exc:
                raise RejectedDownloadError(f"remote {self.url} returned a bad record: {exc}") from None
        return data

    def download_blob(self, digest: str, sink: Callable[[bytes], object],
                      limit: int | None = None) -> bool:
        """Stream a blob's body into `sink` chunk by chunk; False on 404.

        The chunks are *not* verified here: the consumer hashes them (a `BlobWriter` opened with
        `expected=digest`) and discards everything on a mismatch.
        """
        check_digest(digest)
        return self._download("cas", digest, min(limit or MAX_BLOB_BYTES, MAX_BLOB_BYTES), sink)

    def put(self, kind: Kind, name: str, data: bytes) -> None:
        kind = check_kind(kind)
        check_digest(name, "digest" if kind == "cas" else "key")
        self._upload(kind, name, data, len(data))

    def put_file(self, digest: str, path: Path) -> None:
        check_digest(digest)
        with open(path, "rb") as f:
            self._upload("cas", digest, f, os.fstat(f.fileno()).st_size)

    def contains(self, kind: Kind, name: str) -> bool:
        kind = check_kind(kind)
        check_digest(name, "digest" if kind == "cas" else "key")
        status, _ = self._exchange("HEAD", self._path(kind, name), None, 0, None, 0)
        if status in (200, 404):
            return status == 200
        raise self._status_error("HEAD", status)

    # -- HTTP ------------------------------------------------------------------------------

    def _path(self, kind: Kind, name: str) -> str:
        return f"{self._base}/{kind}/{name}"

    def _download(self, kind: Kind, name: str, cap: int, sink) -> bool:
        status, _ = self._exchange("GET", self._path(kind, name), None, 0, sink, cap)
        if status == 200:
            return True
        if status == 404:
            return False
        raise self._status_error("GET", status)

    def _upload(self, kind: Kind, name: str, body: bytes | BinaryIO, size: int) -> None:
        if self.uploads_refused:
            raise RemoteAuthError(self.uploads_refused)
        status, _ = self._exchange("PUT", self._path(kind, name), body, size, None, 0)
        if 200 <= status < 300:
            return
        if status in (401, 403):
            self.uploads_refused = f"remote cache {self.url} refused an upload (HTTP {status}): {TOKEN_HINT}"
            raise RemoteAuthError(self.uploads_refused)
        if status >= 500:
            raise self._status_error("PUT", status)
        self.uploads_refused = f"remote cache {self.url} refused an upload (HTTP {status})"
        raise RemoteAuthError(self.uploads_refused)

    def _status_error(self, method: str, status: int) -> RemoteUnavailableError | RemoteAuthError:
        if status in (401, 403):
            reason = f"refused to read (HTTP {status}); set XG_REMOTE_CACHE_HEADER if it needs a token"
            self.down = f"remote cache {self.url} {reason}"
            return RemoteAuthError(self.down)
        return self._trip(f"answered HTTP {status} to {method}")

    def _trip(self, reason: str) -> RemoteUnavailableError:
        self.down = f"remote cache {self.url} {reason}"
        self._close()
        return RemoteUnavailableError(self.down)

    def _exchange(self, method: str, path: str, body, size: int, sink, cap: int) -> tuple[int, int]:
        """One request with at most one retry on a stale keep-alive connection; (status, bytes read)."""
        if self.down:
            raise RemoteUnavailableError(self.down)
        for attempt in (0, 1):
            conn, reused = self._connection()
            try:
                return self._once(conn, method, path, body, size, sink, cap)
            except _RETRYABLE as exc:
                self._close()
                if not (reused and attempt == 0):
                    raise self._trip(f"dropped the connection ({type(exc).__name__})") from None
                if hasattr(body, "seek"):
                    body.seek(0)
            except (TimeoutError, socket.timeout):
                raise self._trip(f"did not answer within {self.timeout_s:g} s") from None
            except _Interrupted as exc:
                raise self._trip(f"interrupted the transfer of {path.rsplit('/', 1)[-1]} after {exc.got} of "
                                 f"{exc.declared if exc.declared is not None else 'the'} bytes (transfer "
                                 "interrupted: the server went away; nothing was used)") from None
            except ConnectionRefusedError:
                raise self._trip("refused the connection (is it running?)") from None
            except ssl.SSLError as exc:
                raise self._trip(f"failed TLS: {exc.reason or exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                raise self._trip(f"is unreachable ({_describe(exc)})") from None
        raise AssertionError("unreachable")

    def _once(self, conn: http.client.HTTPConnection, method: str, path: str, body, size: int,
              sink, cap: int) -> tuple[int, int]:
        headers = {"User-Agent": "xg-cache/1", "Accept": "*/*"}
        if self._header:
            headers[self._header[0]] = self._header[1]
        if method == "PUT":
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(size)
        # One deadline for the whole exchange: every socket wait is cut to the time left.
        conn.start_deadline(self.timeout_s + size / MIN_RATE)
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        status = resp.status
        length = resp.getheader("Content-Length")
        declared = int(length) if length and length.isdigit() else None
        if status != 200 or sink is None:
            # Drain small bodies so the connection can be reused; drop it after big ones.
            if method == "HEAD" or (declared is not None and declared <= 65536):
                resp.read()
            else:
                resp.close()
                self._close()
            return status, 0
        if declared is not None and declared > cap:
            resp.close()
            self._close()
            raise RejectedDownloadError(
                f"remote {self.url} offered {declared} bytes for {path}, over the {cap}-byte cap")
        got = 0
        try:
            while chunk := resp.read(CHUNK):
                got += len(chunk)
                if got > cap:
                    resp.close()
                    self._close()
                    raise RejectedDownloadError(f"remote {self.url} sent more than {cap} bytes for {path}")
                sink(chunk)
        except http.client.IncompleteRead:
            raise _Interrupted(got, declared) from None
        if declared is not None and got != declared:
            raise _Interrupted(got, declared)
        return status, got

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is not None and getattr(local, "pid", None) == os.getpid():
            return conn, True
        if self._https:
            conn = _HTTPSConnection(self._host, self._port, timeout=self.timeout_s,
                                    context=ssl.create_default_context(), blocksize=CHUNK)
        else:
            conn = _HTTPConnection(self._host, self._port, timeout=self.timeout_s, blocksize=CHUNK)
        local.conn, local.pid = conn, os.getpid()
        return conn, False

    def _close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    def close(self) -> None:
        self._close()


class _Interrupted(Exception):
    """The body ended (the connection closed) before the length the server declared."""

    def __init__(self, got: int, declared: int | None) -> None:
        super().__init__(got, declared)
        self.got, self.declared = got, declared


class _Deadline:
    """The deadline of the exchange in progress on one connection: `allowance` seconds from its
    start plus one second per `MIN_RATE` bytes received so far (a fast big download is not cut
    off; a trickle earns nothing)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.allowance = 0.0
        self.received = 0

    def left(self) -> float:
        left = self.start + self.allowance + self.received / MIN_RATE - time.monotonic()
        if left <= 0:
            raise TimeoutError("the remote cache request ran past its deadline")
        return left


class _DeadlineReader(io.RawIOBase):
    """A socket's read side whose every wait is cut to the time the exchange has left."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        self._sock.settimeout(self._deadline.left())
        n = self._sock.recv_into(buf)
        self._deadline.received += n
        return n


class _DeadlineSocket:
    """What http.client sees as its socket: reads (`makefile`) and sends bounded by the deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline), CHUNK)

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._sock.settimeout(self._deadline.left())
            sent = self._sock.send(view[:CHUNK])
            view = view[sent:]

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class _DeadlineMixin:
    """An HTTP connection whose exchanges each run under one `_Deadline` (`start_deadline`)."""

    deadline: _Deadline

    def start_deadline(self, allowance: float) -> None:
        self.deadline = _Deadline()
        self.deadline.allowance = allowance

    def connect(self) -> None:
        self.timeout = self.deadline.left()      # the connect (and TLS handshake) share the deadline
        super().connect()                        # type: ignore[misc]
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _HTTPConnection(_DeadlineMixin, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineMixin, http.client.HTTPSConnection):
    pass


def _describe(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.lower() if isinstance(text, str) else type(exc).__name__
