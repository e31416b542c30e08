"""Fixtures for the cache tests: a real nginx cache server, fault-injecting HTTP servers, stores.

`nginx_cache` starts tools/cache-server (Debian's nginx with WebDAV) in a temp dir and stops it by
PID afterwards; it skips only when /usr/sbin/nginx is absent. The fault servers are small
`http.server` threads on 127.0.0.1 that misbehave on purpose (wrong bytes, 500s, hangs).
"""

from __future__ import annotations

import http.server
import logging
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from .cache_helpers import CACHE_SERVER, NGINX, Server
from xgbuild.cache import Cache, LocalStore, RemoteStore


def _start_nginx(root: Path, token: str | None = None) -> Iterator[Server]:
    if not NGINX.exists():
        pytest.skip(f"{NGINX} is not installed (apt-get install nginx); the remote tests need it")
    cmd = [sys.executable, str(CACHE_SERVER), "start", "--dir", str(root)]
    if token:
        cmd += ["--token", token]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    url = proc.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and "\n" not in url
    try:
        yield Server(url, root, token)
    finally:
        subprocess.run([sys.executable, str(CACHE_SERVER), "stop", "--dir", str(root)],
                       capture_output=True, timeout=60)


@pytest.fixture
def nginx_cache(tmp_path: Path) -> Iterator[Server]:
    """A running nginx Bazel-HTTP cache (open for reads and writes)."""
    yield from _start_nginx(tmp_path / "nginx")


@pytest.fixture
def nginx_token_cache(tmp_path: Path) -> Iterator[Server]:
    """A running nginx cache whose PUTs need `Authorization: Bearer <token>`."""
    yield from _start_nginx(tmp_path / "nginx-token", token="t0ken-for-tests")


# -- fault servers ---------------------------------------------------------------------------

@dataclass
class FaultServer:
    url: str
    requests: list[tuple[str, str]] = field(default_factory=list)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    behave: Callable[["_Handler"], None]
    seen: list

    def _any(self) -> None:
        self.seen.append((self.command, self.path))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        type(self).behave(self)

    do_GET = do_PUT = do_HEAD = _any

    def reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fault_server() -> Iterator[Callable[[Callable[[_Handler], None]], FaultServer]]:
    """Factory: `fault_server(behave)` serves every request with `behave(handler)`."""
    servers = []

    def make(behave: Callable[[_Handler], None]) -> FaultServer:
        seen: list = []
        handler = type("H", (_Handler,), {"behave": staticmethod(behave), "seen": seen})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return FaultServer(f"http://127.0.0.1:{srv.server_address[1]}", seen)

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def hanging_url() -> Iterator[str]:
    """A port that accepts TCP connections (kernel backlog) but never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def refused_url() -> str:
    """A port nothing listens on: connections are refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


# -- keys and caches -------------------------------------------------------------------------

@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalStore]:
    store = LocalStore(tmp_path / "cache")
    yield store
    store.close()


@pytest.fixture
def open_cache(tmp_path: Path) -> Iterator[Callable[..., Cache]]:
    """Factory: `open_cache(name, remote=None, upload=True, header=None, timeout_s=5)`."""
    opened: list[Cache] = []

    def make(name: str = "cache", remote: str | None = None, upload: bool = True,
             header: tuple[str, str] | None = None, timeout_s: float = 5.0) -> Cache:
        rs = RemoteStore(remote, header=header, timeout_s=timeout_s) if remote else None
        cache = Cache(LocalStore(tmp_path / name), rs, upload=upload)
        opened.append(cache)
        return cache

    yield make
    for cache in opened:
        cache.close()


@pytest.fixture
def cache_warnings(caplog: pytest.LogCaptureFixture,
                   monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """The warnings the cache logged so far (the `xgbuild.cache` logger)."""
    # The CLI, run in-process by other tests, turns propagation off to avoid double printing.
    monkeypatch.setattr(logging.getLogger("xgbuild.cache"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="xgbuild.cache")
    return lambda: [r.getMessage() for r in caplog.records
                    if r.name == "xgbuild.cache" and r.levelno == logging.WARNING]
