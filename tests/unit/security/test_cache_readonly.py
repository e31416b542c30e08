"""A cache that cannot be written: a read-only mount, and a full disk.

docs/cache.md promises that reads (`cache get`, lookups in a build) and `cache gc` work on a full
disk, and that a read-only cache can still be read (with a note that nothing is recorded). Both
used to fail with SQLite's "disk I/O error" / "attempt to write a readonly database": SQLite
could not create or grow the index's shared-memory file. Real filesystems here (a tmpfs filled to
the last block, a read-only bind mount); skipped where this host may not mount.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from xgbuild.cache import Cache, CacheKey, LocalStore, ReadOnlyStoreError

ROOT = Path(__file__).resolve().parents[3]


def key(i: int) -> CacheKey:
    return CacheKey(kernel_ir={"id": i}, shapes={}, dtypes={}, gpu_profile={"sm": 90}, search_space={}, policy={})


def cli(cache_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XG_")}
    env.update(XG_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "xgbuild.cli.cache_cmd", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=str(ROOT))


def mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip() or 'not permitted'})")


def filled(root: Path) -> tuple[str, bytes, CacheKey]:
    data = os.urandom(50_000)
    with Cache(LocalStore(root)) as cache:
        digest = cache.put_blob(data)
        cache.store(key(1), {"v": 1, "origin": "local"}, {"cubin": data})
    return digest, data, key(1)


@pytest.fixture
def read_only_cache(tmp_path: Path) -> Iterator[tuple[Path, str, bytes, CacheKey]]:
    """A populated cache seen through a read-only bind mount."""
    digest, data, k = filled(tmp_path / "rw" / "cache")
    view = tmp_path / "ro"
    view.mkdir()
    mount("--bind", "-o", "ro", str(tmp_path / "rw"), str(view))
    try:
        yield view / "cache", digest, data, k
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True)


@pytest.mark.timeout(120)
def test_a_read_only_cache_is_read_with_a_note(read_only_cache, tmp_path: Path) -> None:
    root, digest, data, k = read_only_cache
    got = cli(root, "get", digest, "-o", str(tmp_path / "out"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "out").read_bytes() == data
    assert "read-only" in got.stderr and "nothing will be recorded" in got.stderr and "Traceback" not in got.stderr
    shown = cli(root, "explain", k.digest)
    assert shown.returncode == 0 and k.digest in shown.stdout, shown.stderr
    with Cache(LocalStore(root)) as cache:
        hit = cache.lookup(k)
        assert hit is not None and hit.blobs["cubin"] == data
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            cache.put_blob(b"new bytes")
    (tmp_path / "new").write_bytes(b"new bytes")
    put = cli(root, "put", str(tmp_path / "new"))
    assert put.returncode == 1 and put.stdout == "" and "Traceback" not in put.stderr
    assert put.stderr.splitlines()[-1].startswith("error: the cache at") and "read-only" in put.stderr


@pytest.fixture
def full_disk_cache(tmp_path: Path) -> Iterator[tuple[Path, str, bytes]]:
    """A populated cache on a tmpfs filled to its last block."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
    try:
        digest, data, _ = filled(mnt / "cache")
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        # SQLite's -shm file is sized on open: take away what it had, as a disk that filled
        # while no XG process was running would.
        for extra in ("index.sqlite-shm", "index.sqlite-wal"):
            (mnt / "cache" / extra).unlink(missing_ok=True)
        yield mnt / "cache", digest, data
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.timeout(120)
def test_get_and_gc_work_on_a_full_disk(full_disk_cache, tmp_path: Path) -> None:
    root, digest, data = full_disk_cache
    assert os.statvfs(root).f_bavail == 0
    got = cli(root, "get", digest, "-o", str(tmp_path / "out"))
    assert got.returncode == 0 and "disk I/O error" not in got.stderr, got.stderr
    assert (tmp_path / "out").read_bytes() == data
    gc = cli(root, "gc", "--max-size", "0")
    assert gc.returncode == 0 and "disk I/O error" not in gc.stderr, gc.stderr
    assert cli(root, "verify").returncode == 0
