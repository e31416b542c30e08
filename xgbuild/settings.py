"""XG's settings: the one module that reads the environment.

Every other module takes a `Settings` (or the values it needs) as an argument; nothing else calls
`os.environ`. CLI flags override these values by building a new `Settings` with
`dataclasses.replace`. A setting that changes build output must also be part of the cache key.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_DIRS = ("hw", "std", "rules_xg")    # data XG ships beside its code: profiles, std library, Bazel rules


def shipped_dir(name: str) -> Path:
    """Where one of `SHIPPED_DIRS` lives: package data of an installed wheel (setup.py copies them
    to xgbuild/_data/), else the checkout's root, where they are kept and edited."""
    if name not in SHIPPED_DIRS:
        raise ValueError(f"XG ships no directory {name!r}; it ships {', '.join(SHIPPED_DIRS)}")
    # A real directory, not only a Traversable: profiles are globbed, and Bazel and error messages
    # need paths. A wheel is always unpacked on install, so this holds for every installed XG.
    packaged = importlib.resources.files("xgbuild").joinpath("_data", name)
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return REPO_ROOT / name


BUILTIN_HW_DIR = shipped_dir("hw")     # the GPU profiles XG ships; XG_HW_DIR names another directory


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


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")   # an HTTP token (RFC 9110)


def parse_header(raw: str) -> tuple[str, str]:
    """Split an XG_REMOTE_CACHE_HEADER value, "Name: value", refusing anything malformed."""
    name, sep, value = raw.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _HEADER_NAME.fullmatch(name) or not value or any(c in value for c in "\r\n\0"):
        # Never echo what may be a secret: keep at most the name, mask the rest.
        shown = f"{name[:40]}: ***" if sep else "***"
        raise SettingsError(
            f"XG_REMOTE_CACHE_HEADER={shown!r} is not a header: expected 'Name: value', "
            "e.g. 'Authorization: Bearer <token>'"
        )
    return name, value


def read_header_file(path: Path | str) -> str:
    """The "Name: value" header held in a credential file (XG_REMOTE_CACHE_HEADER_FILE,
    `--remote-header-file`): how a build system hands XG a token without putting the token in an
    action's command line or environment, where it would enter the action key and logs."""
    try:
        raw = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else "not readable text"
        raise SettingsError(f"remote cache header file {str(path)!r}: {reason}") from None
    try:
        parse_header(raw)
    except SettingsError:
        raise SettingsError(f"remote cache header file {str(path)!r} does not hold one 'Name: value' line, "
                            "e.g. 'Authorization: Bearer <token>'") from None
    return raw


@dataclass(frozen=True)
class Settings:
    """Everything configurable from the environment, with defaults."""

    cache_dir: Path = field(default_factory=lambda: _default_cache_dir(os.environ))
    remote_cache: str | None = None          # XG_REMOTE_CACHE: base URL of a Bazel HTTP cache
    remote_header: str | None = None         # XG_REMOTE_CACHE_HEADER (or _FILE): "Name: value" sent with requests
    remote_timeout_s: float = 10.0           # XG_REMOTE_TIMEOUT: seconds per remote request
    remote_upload: bool = True               # XG_NO_REMOTE_UPLOAD=1 makes this host a reader only
    hw_dir: Path = BUILTIN_HW_DIR            # XG_HW_DIR: where the GPU profiles live
    builder_id: str = field(default_factory=lambda: default_builder_id())   # XG_BUILDER_ID: in provenance

    def __post_init__(self) -> None:
        if self.remote_header is not None:
            parse_header(self.remote_header)     # fail at configuration time, not mid-build
        if not self.remote_timeout_s > 0:
            raise SettingsError(f"remote timeout must be positive, got {self.remote_timeout_s!r}")

    @property
    def remote_header_pair(self) -> tuple[str, str] | None:
        """`remote_header` split into (name, value), or None."""
        return None if self.remote_header is None else parse_header(self.remote_header)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        return cls(
            cache_dir=Path(env["XG_CACHE_DIR"]) if env.get("XG_CACHE_DIR") else _default_cache_dir(env),
            remote_cache=env.get("XG_REMOTE_CACHE") or None,
            remote_header=env.get("XG_REMOTE_CACHE_HEADER") or (
                read_header_file(env["XG_REMOTE_CACHE_HEADER_FILE"]) if env.get("XG_REMOTE_CACHE_HEADER_FILE")
                else None),
            remote_timeout_s=_float(env, "XG_REMOTE_TIMEOUT", 10.0),
            remote_upload=not _flag(env.get("XG_NO_REMOTE_UPLOAD")),
            hw_dir=_hw_dir(env),
            builder_id=env.get("XG_BUILDER_ID") or default_builder_id(),
        )


def default_builder_id() -> str:
    """Who signed provenance says built an engine when XG_BUILDER_ID does not say: this host."""
    import socket
    return f"xg+host://{socket.gethostname() or 'localhost'}"


def _hw_dir(env: Mapping[str, str]) -> Path:
    if not env.get("XG_HW_DIR"):
        return BUILTIN_HW_DIR
    path = Path(env["XG_HW_DIR"])
    if not path.is_dir():   # caught here, not as a missing profile deep inside the checker
        raise SettingsError(f"XG_HW_DIR={env['XG_HW_DIR']!r} is not a directory of GPU profiles")
    return path


@dataclass(frozen=True)
class RunSettings:
    """How engines run, from the environment; read by the commands and `xg` and handed to the
    runtime. The SPMD values stay raw text: the runtime checks them on every rank of a run, so a
    bad value on one rank stops all of them, naming it."""

    cuda_graphs: bool = True             # XG_CUDA_GRAPHS=0: no capture (later runs replay a captured CUDA graph)
    spmd_kernels: str = ""               # XG_SPMD_KERNELS: "" or 1 (kernels), 0 (torch ops), interpret
    comm_blocks: str = "auto"            # XG_COMM_BLOCKS: auto or N row blocks of a reduced matmul
    triton_interpret: bool = False       # TRITON_INTERPRET=1: Triton was imported in interpreter mode
    trusted_keys: Path | None = None     # XG_TRUSTED_KEYS: a directory of .pub keys; engines must be signed by one

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RunSettings":
        env = os.environ if env is None else env
        return cls(cuda_graphs=env.get("XG_CUDA_GRAPHS", "1") != "0", spmd_kernels=env.get("XG_SPMD_KERNELS", ""),
                   comm_blocks=env.get("XG_COMM_BLOCKS", "auto"), triton_interpret=env.get("TRITON_INTERPRET") == "1",
                   trusted_keys=Path(env["XG_TRUSTED_KEYS"]) if env.get("XG_TRUSTED_KEYS") else None)


def child_env() -> dict[str, str]:
    """The environment of the processes a command starts (ranks, compile workers): this one's,
    with the settings above in it as they were read."""
    return dict(os.environ)


def tune_exhaustive() -> bool:
    """XG_TUNE_EXHAUSTIVE=1: the tuner compiles and times every candidate in full (no bound, no
    racing, 50 runs each): how it tuned before its search stopped early, kept for comparisons."""
    return _flag(os.environ.get("XG_TUNE_EXHAUSTIVE"))


def tune_in_process() -> bool:
    """XG_TUNE_IN_PROCESS=1: several local GPUs measure from threads of the build's own process
    instead of one process each (`tuner.gpu_procs`)."""
    return _flag(os.environ.get("XG_TUNE_IN_PROCESS"))


def visible_devices() -> list[str]:
    """CUDA_VISIBLE_DEVICES as a list (empty when unset: every device is visible)."""
    return [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def visible_device(index: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry for torch's device `index` in this process."""
    visible = visible_devices()
    return visible[index] if index < len(visible) else str(index)


def use_triton_interpreter() -> None:
    """Make Triton interpret kernels on CPU tensors. Triton reads TRITON_INTERPRET once, when it is
    imported: call this before anything imports it. The one place XG writes the environment."""
    os.environ["TRITON_INTERPRET"] = "1"


@dataclass(frozen=True)
class DistEnv:
    """One rank's place in a distributed run, as a launcher (`xgrun --nproc`, torchrun, SLURM) sets it."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    heartbeat_fd: int | None = None      # XG_HEARTBEAT_FD: a pipe to `xgrun --nproc`, which watches for hangs


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    if not (raw.strip().isascii() and raw.strip().isdigit()):     # int() would take `৪` as 4
        raise SettingsError(f"{name}={raw!r} is not a non-negative integer")
    return int(raw)


def dist_env(env: Mapping[str, str] | None = None) -> DistEnv | None:
    """The distributed run this process is a rank of, or None when it runs alone.

    torchrun and `xgrun --nproc` set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
    under SLURM (srun) SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID stand in for the first three.
    """
    env = os.environ if env is None else env
    rank = _int(env, "RANK")
    world = _int(env, "WORLD_SIZE")
    local = _int(env, "LOCAL_RANK")
    if rank is None and world is None:
        rank, world, local = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID")
    if rank is None or world is None:
        if rank is not None or world is not None:
            raise SettingsError("RANK and WORLD_SIZE come together: set both (or neither)")
        return None
    if world < 1 or rank >= world:
        raise SettingsError(f"RANK={rank} is not below WORLD_SIZE={world}")
    port = _int(env, "MASTER_PORT")
    if world > 1 and (not env.get("MASTER_ADDR") or port is None):
        raise SettingsError("a distributed run needs MASTER_ADDR and MASTER_PORT (rank 0's host and a free port)")
    return DistEnv(rank, world, rank if local is None else local, env.get("MASTER_ADDR") or "127.0.0.1",
                   port or 0, _int(env, "XG_HEARTBEAT_FD"))
