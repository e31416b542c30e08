"""Helpers shared by the cache tests: key builders, server handles, CLI runners.

Kept out of conftest.py so test modules can import them by a name no other test folder uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from xgbuild.cache import CacheKey

REPO = Path(__file__).resolve().parents[3]
CACHE_SERVER = REPO / "tools" / "cache-server"
NGINX = Path("/usr/sbin/nginx")
TOOLCHAIN = {"cuda": "13.0", "python": "3.11", "triton": "3.6.0", "xg_source": "0" * 64}


@dataclass
class Server:
    url: str
    dir: Path
    token: str | None = None

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def header(self) -> tuple[str, str] | None:
        return ("Authorization", f"Bearer {self.token}") if self.token else None


def make_key(i: int = 0, **overrides: object) -> CacheKey:
    parts = dict(
        kernel_ir={"ops": ["load", "dot", "store"], "id": i},
        shapes={"A": [128, 64], "B": [64, 32]},
        dtypes={"A": "float16", "B": "float16", "out": "float32"},
        gpu_profile={"name": "H100", "sm": 90, "smem_per_sm": 232448},
        search_space={"BLOCK_M": [64, 128], "num_warps": [4, 8]},
        policy={"mode": "measure", "repeats": 50},
        toolchain=TOOLCHAIN,
    )
    parts.update(overrides)
    return CacheKey(**parts)


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment for running the CLI as a subprocess, free of the caller's cache settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XG_")}
    env.update({"XG_CACHE_DIR": str(tmp_path / "cli-cache"), "PYTHONPATH": str(REPO)})
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xgbuild.cli.cache_cmd", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def assert_clean_stderr(stderr: str) -> None:
    """No traceback, ever; every line is an `error:` or `warning:` message."""
    assert "Traceback" not in stderr, stderr
    for line in stderr.splitlines():
        assert line.startswith(("error: ", "warning: ")), stderr
