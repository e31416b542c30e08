"""Helpers of the Bazel tests (and tools/bench/bench_bazel.py): real Bazel 4.2.3, offline.

`Workspace` runs `bazel` in a directory: the checkout itself, or a copy of it made elsewhere (a
"second checkout": the files git knows, committed or not, without build outputs or .venv). Copies
use the checkout's virtualenv through `XG_PYTHON`, the way a user points XG at an environment of
their own. Every workspace's Bazel server is shut down (and a copy's output base removed) at the
end (by the fixtures in conftest.py), so no server outlives the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python3"
BAZEL = shutil.which("bazel") or "/usr/bin/bazel"
BAZELISK = REPO / ".tools" / "node_modules" / ".bin" / "bazelisk"


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    def env(self, python: str | Path = PYTHON) -> dict[str, str]:
        env = dict(os.environ)
        env["XG_PYTHON"] = str(python)
        return env

    def run(self, *args: str, bazel: str | Path = BAZEL, timeout: float = 1200,
            python: str | Path = PYTHON) -> subprocess.CompletedProcess:
        return subprocess.run([str(bazel), *args], cwd=self.root, env=self.env(python), capture_output=True,
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


def summary(res: subprocess.CompletedProcess) -> str:
    """Bazel's "INFO: N processes: ..." line of a build."""
    for line in (res.stderr + res.stdout).splitlines():
        if " processes" in line and line.startswith("INFO:"):
            return line
    return ""


def explain(res: subprocess.CompletedProcess) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n{res.stderr[-6000:]}"
