"""XG's settings: the one module that reads the environment.

Every other module takes a `Settings` (or the values it needs) as an argument; nothing else calls
`os.environ`. CLI flags override these values by building a new `Settings` with
`dataclasses.replace`. A setting that changes build output must also be part of the cache key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent


def _default_cache_dir(env: Mapping[str, str]) -> Path:
    # XDG base-directory spec: $XDG_CACHE_HOME, falling back to ~/.cache.
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "xg"


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be positive")
    return value


class SettingsError(ValueError):
    """An environment variable holds a value XG cannot use."""


@dataclass(frozen=True)
class Settings:
    """Everything configurable from the environment, with defaults."""

    cache_dir: Path = field(default_factory=lambda: _default_cache_dir(os.environ))
    remote_cache: str | None = None          # XG_REMOTE_CACHE: base URL of a Bazel HTTP cache
    remote_header: str | None = None         # XG_REMOTE_CACHE_HEADER: "Name: value" sent with every request
    remote_timeout_s: float = 10.0           # XG_REMOTE_TIMEOUT: seconds per remote request
    remote_upload: bool = True               # XG_NO_REMOTE_UPLOAD=1 makes this host a reader only
    hw_dir: Path = REPO_ROOT / "hw"          # XG_HW_DIR: where the GPU profiles live

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        return cls(
            cache_dir=Path(env["XG_CACHE_DIR"]) if env.get("XG_CACHE_DIR") else _default_cache_dir(env),
            remote_cache=env.get("XG_REMOTE_CACHE") or None,
            remote_header=env.get("XG_REMOTE_CACHE_HEADER") or None,
            remote_timeout_s=_float(env, "XG_REMOTE_TIMEOUT", 10.0),
            remote_upload=not _flag(env.get("XG_NO_REMOTE_UPLOAD")),
            hw_dir=Path(env["XG_HW_DIR"]) if env.get("XG_HW_DIR") else REPO_ROOT / "hw",
        )
