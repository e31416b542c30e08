"""tools/cache-server: starts nginx on a free loopback port, serves the protocol, stops by PID."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from .cache_helpers import CACHE_SERVER, NGINX

pytestmark = pytest.mark.skipif(not NGINX.exists(), reason=f"{NGINX} is not installed")


def _server(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CACHE_SERVER), *args],
                          capture_output=True, text=True, timeout=60)


def _request(url: str, method: str, path: str, body: bytes | None = None, headers=None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_start_serves_the_protocol_and_stop_ends_it(tmp_path):
    proc = _server("start", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    url = proc.stdout.strip()
    assert proc.stdout == url + "\n" and url.startswith("http://127.0.0.1:")
    pid = int((tmp_path / "nginx.pid").read_text())
    try:
        assert _alive(pid)
        assert _request(url, "GET", "/cas/" + "ab" * 32)[0] == 404
        assert _request(url, "PUT", "/cas/" + "ab" * 32, b"blob")[0] in (201, 204)
        assert _request(url, "PUT", "/ac/" + "cd" * 32, b"record")[0] in (201, 204)
        assert _request(url, "GET", "/cas/" + "ab" * 32) == (200, b"blob")
        assert _request(url, "HEAD", "/ac/" + "cd" * 32)[0] == 200
        assert _request(url, "DELETE", "/cas/" + "ab" * 32)[0] == 403
        assert (tmp_path / "data" / "ac" / ("cd" * 32)).read_bytes() == b"record"
        assert _server("status", "--dir", str(tmp_path)).stdout.strip() == url
        # A second start on the same directory is refused while the first runs.
        again = _server("start", "--dir", str(tmp_path))
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = _server("stop", "--dir", str(tmp_path))
    assert stopped.returncode == 0
    assert not _alive(pid)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", urlsplit(url).port), timeout=1).close()
    assert _server("status", "--dir", str(tmp_path)).returncode == 1
    # Everything it wrote stayed in its directory.
    assert {p.name for p in tmp_path.iterdir()} >= {"data", "logs", "tmp", "nginx.conf"}


def test_token_mode_guards_puts_only(tmp_path):
    url = _server("start", "--dir", str(tmp_path), "--token", "sekrit-token").stdout.strip()
    try:
        path = "/cas/" + "ef" * 32
        status, _ = _request(url, "PUT", path, b"x")
        assert status == 401
        assert _request(url, "PUT", path, b"x", {"Authorization": "Bearer nope-nope"})[0] == 401
        assert _request(url, "PUT", path, b"x", {"Authorization": "Bearer sekrit-token"})[0] in (201, 204)
        assert _request(url, "GET", path) == (200, b"x")
    finally:
        _server("stop", "--dir", str(tmp_path))


def test_two_servers_get_different_free_ports(tmp_path):
    a = _server("start", "--dir", str(tmp_path / "a")).stdout.strip()
    b = _server("start", "--dir", str(tmp_path / "b")).stdout.strip()
    try:
        assert a != b and a and b
    finally:
        _server("stop", "--dir", str(tmp_path / "a"))
        _server("stop", "--dir", str(tmp_path / "b"))


def test_bad_arguments_are_refused(tmp_path):
    proc = _server("start", "--dir", str(tmp_path), "--token", "bad token; return 200")
    assert proc.returncode == 2 and "--token" in proc.stderr
    proc = _server("start", "--dir", str(tmp_path), "--nginx", "/nonexistent/nginx")
    assert proc.returncode == 1 and "nginx not found" in proc.stderr
    stop = _server("stop", "--dir", str(tmp_path))
    assert stop.returncode == 0 and "no server running" in stop.stderr


def test_stop_leaves_an_unrelated_process_with_a_reused_pid_alone(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "nginx.pid").write_text(f"{sleeper.pid}\n")
        _server("stop", "--dir", str(tmp_path))
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert os.path.exists(CACHE_SERVER) and os.access(CACHE_SERVER, os.X_OK)
