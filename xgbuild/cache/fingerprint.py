"""The toolchain fingerprint: the cache-key part that changes whenever the tools that built a result do.

It covers XG's own Python sources (so editing the tuner or codegen invalidates old winners), the
Triton version (it compiles the kernels), the CUDA bindings version and the Python major.minor.
The source hash is over sorted *relative* paths and file contents, so the same checkout hashes the
same wherever it lives; `__pycache__` and other non-source files are left out because they differ
between machines without changing behaviour.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

XG_PACKAGE_DIR = Path(__file__).resolve().parent.parent   # .../xgbuild


def source_digest(root: Path = XG_PACKAGE_DIR) -> str:
    """sha256 over every `*.py` under `root`: sorted relative paths, each with its length and bytes."""
    return _source_digest(Path(root).resolve())


@functools.lru_cache(maxsize=8)
def _source_digest(root: Path) -> str:
    # Memoised per process: sources do not change under a running build, and hashing ~1 MB of
    # Python on every key would dominate a cache lookup.
    h = hashlib.sha256(b"xg-source/1\0")
    files = sorted(
        (p.relative_to(root).as_posix(), p)
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts and p.is_file()
    )
    for rel, path in files:
        data = path.read_bytes()
        # Length-prefixed fields, so moving bytes between a name and a body changes the hash.
        h.update(f"{len(rel)}:{rel}\0{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cuda_version() -> str:
    """The CUDA bindings' version if `cuda.bindings` imports, else "none"."""
    try:
        import cuda.bindings  # noqa: PLC0415 - optional dependency, probed at call time
    except ImportError:
        return "none"
    return str(getattr(cuda.bindings, "__version__", None) or _package_version("cuda-bindings"))


def toolchain_fingerprint(source_root: Path = XG_PACKAGE_DIR) -> Mapping[str, str]:
    """The `toolchain` key part: XG source hash, Triton, CUDA and Python versions."""
    return _toolchain(Path(source_root).resolve())


@functools.lru_cache(maxsize=8)
def _toolchain(source_root: Path) -> Mapping[str, str]:
    # Memoised per process like the source hash: installed versions do not change under a build.
    return MappingProxyType({
        "cuda": cuda_version(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "triton": _package_version("triton"),
        "xg_source": source_digest(source_root),
    })
