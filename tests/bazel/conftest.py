"""Fixtures for the Bazel tests: real Bazel 4.2.3 (Debian's bazel-bootstrap), offline.

`Workspace` runs `bazel` in a directory: the checkout itself, or a copy of it made elsewhere (a
"second checkout": the files git knows, committed or not, without build outputs or .venv). Copies
use the checkout's virtualenv through `XG_PYTHON`, the way a user points XG at an environment of
their own. Every workspace's Bazel server is shut down (and a copy's output base removed) at the
end, so no server outlives the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python3"
BAZEL = shutil.which("bazel") or "/usr/bin/bazel"
BAZELISK = REPO / ".tools" / "node_modules" / ".bin" / "bazelisk"


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["XG_PYTHON"] = str(PYTHON)
        return env

    def run(self, *args: str, bazel: str | Path = BAZEL, timeout: float = 1200) -> subprocess.CompletedProcess:
        return subprocess.run([str(bazel), *args], cwd=self.root, env=self.env(), capture_output=True,
                              text=True, timeout=timeout)

    def build(self, *args: str, **kw) -> subprocess.CompletedProcess:
        res = self.run("build", "--config=ci", *args, **kw)
        return res

    def bin(self, path: str) -> Path:
        return self.root / "bazel-bin" / path

    def shutdown(self, expunge: bool = False) -> None:
        if expunge:
            self.run("clean", "--expunge", timeout=300)
        self.run("shutdown", timeout=120)


def copy_checkout(dest: Path) -> Workspace:
    """A second checkout: the files git knows (tracked, or untracked and not ignored)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = REPO / rel
        if not src.is_file():          # deleted in the working tree but not yet in the index
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return Workspace(dest)


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


def summary(res: subprocess.CompletedProcess) -> str:
    """Bazel's "INFO: N processes: ..." line of a build."""
    for line in (res.stderr + res.stdout).splitlines():
        if " processes" in line and line.startswith("INFO:"):
            return line
    return ""


def explain(res: subprocess.CompletedProcess) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n{res.stderr[-6000:]}"


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
