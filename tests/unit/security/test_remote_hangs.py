"""Hostile remote caches that stall instead of answering: slow-loris servers on 127.0.0.1.

Each server is a thread on a raw socket: one trickles its status line and headers a byte every
0.5 s forever, one sends headers and then trickles the body, one accepts and never says a word,
one dies half way through a body. Every remote request has one total deadline (connect, headers,
body), so `xgbuild cache get` and an `xgc` build with the remote configured finish within the
timeout and a small margin, with one clear warning; the build still succeeds (a slow or dead
remote only slows a build), and a server killed mid-transfer reads as an interrupted transfer,
never as poisoning.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from xgbuild.cache import Cache, LocalStore, RemoteStore, RemoteUnavailableError

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
TIMEOUT = 2.0
MARGIN = 3.0            # seconds beyond the timeout a request may take (thread scheduling, a busy host)
DIGEST = hashlib.sha256(b"the blob the client asks for").hexdigest()


def trickle_headers(conn: socket.socket, stop: threading.Event) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 10_000:
        if stop.wait(0.5):
            return
        conn.sendall(bytes([byte]))


def trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    while not stop.wait(0.5):
        conn.sendall(b"x")


def silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(60)


def dies_mid_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"y" * 40_000)
    conn.shutdown(socket.SHUT_RDWR)


SERVERS = {"trickled headers": trickle_headers, "trickled body": trickle_body, "silent": silent}


@pytest.fixture
def serve() -> Iterator[Callable[[Callable], str]]:
    """Factory: `serve(behave)` answers every connection on 127.0.0.1 with `behave(conn, stop)`."""
    stop = threading.Event()
    socks: list[socket.socket] = []

    def make(behave: Callable) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        socks.append(sock)

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                def handle(c: socket.socket = conn) -> None:
                    try:
                        c.recv(65536)                  # the request
                        behave(c, stop)
                    except OSError:
                        pass
                    finally:
                        c.close()
                threading.Thread(target=handle, daemon=True).start()
        threading.Thread(target=accept, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield make
    stop.set()
    for sock in socks:
        sock.close()


def env_for(tmp_path: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XG_")}
    env.update(XG_CACHE_DIR=str(tmp_path / "cache"), XG_REMOTE_CACHE=url, XG_REMOTE_TIMEOUT=str(TIMEOUT),
               PYTHONPATH=str(ROOT))
    return env


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(SERVERS))
def test_every_request_ends_at_its_deadline(serve, name: str) -> None:
    remote = RemoteStore(serve(SERVERS[name]), timeout_s=TIMEOUT)
    for kind, key in (("cas", DIGEST), ("ac", DIGEST)):
        start = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match=f"did not answer within {TIMEOUT:g} s"):
            remote.get(kind, key)
        assert time.monotonic() - start < TIMEOUT + MARGIN
        remote.down = None                 # the circuit breaker would answer the next at once
        remote.close()
    start = time.monotonic()
    with pytest.raises(RemoteUnavailableError):
        remote.download_blob(DIGEST, lambda chunk: None)
    assert time.monotonic() - start < TIMEOUT + MARGIN


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(SERVERS))
def test_cache_get_finishes_within_the_timeout(serve, tmp_path: Path, name: str) -> None:
    env = env_for(tmp_path, serve(SERVERS[name]))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "xgbuild.cli.cache_cmd", "get", DIGEST, "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + MARGIN + 10          # + the interpreter's start
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"did not answer within {TIMEOUT:g} s" in proc.stderr and "not in" in proc.stderr, proc.stderr


@pytest.mark.timeout(30)
def test_a_server_killed_mid_transfer_is_an_interrupted_transfer_not_poisoning(serve, tmp_path: Path,
                                                                               caplog) -> None:
    url = serve(dies_mid_body)
    with Cache(LocalStore(tmp_path / "cache"), RemoteStore(url, timeout_s=TIMEOUT)) as cache:
        caplog.set_level("WARNING", logger="xgbuild.cache")
        assert cache.get_blob(DIGEST) is None
        assert cache.get_file(DIGEST, tmp_path / "out") is False
        counters = cache.local.counters()
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "transfer interrupted" in text and "40000 of 100000 bytes" in text
    assert "poison" not in text and "hash" not in text and "rejected" not in text
    assert counters["rejected_downloads"] == 0 and counters["remote_errors"] >= 1
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["trickled headers", "trickled body"])
def test_a_build_with_a_slow_remote_succeeds(serve, tmp_path: Path, name: str) -> None:
    src = tmp_path / "k.xg"
    src.write_text("extern Tensor[float32, T, D] X\ndef main() {\n    return relu(X * 2.0 + 1.0)\n}\n")
    proc = subprocess.run([str(BIN / "xgc"), str(src), "--target", "H100", "--dim", "T=16", "--dim", "D=32",
                           "--out", str(tmp_path / "k.xge")], capture_output=True, text=True,
                          env=env_for(tmp_path, serve(SERVERS[name])), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "k.xge").exists() and "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "remote cache" in line]
    assert len(warnings) == 1 and f"did not answer within {TIMEOUT:g} s" in warnings[0], proc.stderr
