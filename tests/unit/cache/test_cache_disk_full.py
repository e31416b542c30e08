"""A full disk: a clear error, nothing partial left behind, and a store that still works."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from .cache_helpers import assert_clean_stderr, cli_env, make_key, run_cli
from xgbuild.cache import Cache, LocalStore, StoreFullError, collect
from xgbuild.cache import blobfiles


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _no_partials(store: LocalStore) -> None:
    assert not (store.root / "tmp").exists() or list((store.root / "tmp").iterdir()) == []
    report = store.verify()
    assert report.ok and report.temp_removed == 0, report


def test_enospc_at_fsync_is_a_clear_error_and_leaves_nothing(local, monkeypatch):
    kept = local.put_blob(b"stored before the disk filled")
    monkeypatch.setattr(blobfiles.os, "fsync", _enospc)
    with pytest.raises(StoreFullError, match="no space left") as info:
        local.put_blob(os.urandom(10000))
    assert "gc --max-size" in str(info.value)
    monkeypatch.undo()
    _no_partials(local)
    assert local.totals().blobs == 1 and local.get_blob(kept.digest) == b"stored before the disk filled"
    assert local.put_blob(b"after").digest == hashlib.sha256(b"after").hexdigest()


class _FillsUp:
    """A file wrapper whose writes fail with ENOSPC after `budget` bytes."""

    def __init__(self, f, budget: int) -> None:
        self._f, self._budget = f, budget

    def write(self, data) -> int:
        self._budget -= len(data)
        if self._budget < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.mark.parametrize("how", ["bytes", "stream"])
def test_enospc_mid_write_is_a_clear_error_and_leaves_nothing(local, monkeypatch, tmp_path, how):
    real_fdopen = os.fdopen
    monkeypatch.setattr(blobfiles.os, "fdopen", lambda fd, *a, **k: _FillsUp(real_fdopen(fd, *a, **k), 70000))
    src = tmp_path / "big"
    src.write_bytes(os.urandom(300000))
    with pytest.raises(StoreFullError):
        if how == "bytes":
            local.put_blob(src.read_bytes())
        else:
            local.put_file(src)
    monkeypatch.undo()
    _no_partials(local)
    assert local.totals().blobs == 0
    assert local.put_file(src).size == 300000


def test_a_record_on_a_full_disk_is_all_or_nothing(open_cache, monkeypatch):
    cache = open_cache()
    monkeypatch.setattr(blobfiles.os, "fsync", _enospc)
    with pytest.raises(StoreFullError):
        cache.store(make_key(1), {"v": 1}, {"cubin": b"c" * 1000})
    monkeypatch.undo()
    assert cache.lookup(make_key(1)) is None
    _no_partials(cache.local)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'not permitted'}); "
                    "the simulated-ENOSPC tests cover this case")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_real_full_filesystem(tiny_tmpfs, tmp_path):
    store = LocalStore(tiny_tmpfs / "cache")
    cache = Cache(store)
    stored: dict[str, bytes] = {}
    with pytest.raises(StoreFullError, match="no space left"):
        for i in range(100):       # 512 KiB cannot hold 100 x 64 KiB of random bytes
            data = os.urandom(64 << 10)
            stored[cache.put_blob(data)] = data
            cache.store(make_key(i), {"i": i}, {"cubin": data})
    assert stored, "nothing fit at all"
    # Consistent: every blob that was stored is intact, nothing partial is visible.
    report = store.verify()
    assert report.ok and not report.corrupt, report
    for digest, data in stored.items():
        got = store.get_blob(digest)
        assert got is None or got == data      # a record whose write failed may have gone
    assert not (store.root / "tmp").exists() or list((store.root / "tmp").iterdir()) == []
    # After making room, writes work again.
    collect(store, 64 << 10)
    data = os.urandom(32 << 10)
    assert store.get_blob(cache.put_blob(data)) == data
    cache.close()

    env = cli_env(tmp_path, XG_CACHE_DIR=str(tiny_tmpfs / "cache"))
    big = tmp_path / "big"
    big.write_bytes(os.urandom(1 << 20))
    proc = run_cli("put", str(big), env=env)
    assert proc.returncode == 1 and "no space left" in proc.stderr and proc.stdout == ""
    assert_clean_stderr(proc.stderr)
    proc = run_cli("verify", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
