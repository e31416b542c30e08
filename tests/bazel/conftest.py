"""Fixtures for the Bazel tests: the checkout's workspace, second checkouts, a cache server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from bazel_helpers import PYTHON, REPO, Workspace, copy_checkout


@pytest.fixture(scope="session")
def repo_workspace():
    ws = Workspace(REPO)
    yield ws
    ws.shutdown()


@pytest.fixture
def make_checkout(tmp_path_factory):
    made: list[Workspace] = []

    def make(name: str) -> Workspace:
        ws = copy_checkout(tmp_path_factory.mktemp(name))
        made.append(ws)
        return ws
    yield make
    for ws in made:
        ws.shutdown(expunge=True)


@pytest.fixture
def cache_server(tmp_path: Path):
    """A running nginx serving the Bazel HTTP cache protocol (tools/cache-server); its URL."""
    if not Path("/usr/sbin/nginx").exists():
        pytest.skip("/usr/sbin/nginx is not installed (tools/setup.sh installs it)")
    root = tmp_path / "cache-server"
    server = [str(PYTHON), str(REPO / "tools" / "cache-server")]
    started = subprocess.run([*server, "start", "--dir", str(root)], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run([*server, "stop", "--dir", str(root)], capture_output=True, timeout=60)
