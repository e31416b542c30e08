"""Size-bounded gc: least recently used first; records never outlive their blobs."""

from __future__ import annotations

import os

import pytest

from .cache_helpers import make_key
from xgbuild.cache import Cache, CacheError, LocalStore, collect, parse_size


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def clocked(tmp_path):
    store = LocalStore(tmp_path / "c", clock=Clock())
    yield store
    store.close()


@pytest.mark.parametrize("text, expected", [
    ("123", 123), ("0", 0), ("500K", 500 << 10), ("10M", 10 << 20), ("1G", 1 << 30), ("2T", 2 << 40),
    ("10MiB", 10 << 20), ("10MB", 10 << 20), ("1.5G", 3 << 29), ("64k", 64 << 10), ("7B", 7),
    (" 3M ", 3 << 20),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "M", "-1", "10Q", "1e9", "ten", "10 MBs", "1,000"])
def test_parse_size_refuses_nonsense(bad):
    with pytest.raises(CacheError, match="invalid size"):
        parse_size(bad)


def test_least_recently_used_blobs_go_first(clocked):
    blobs = [os.urandom(10_000) for _ in range(5)]
    refs = [clocked.put_blob(b) for b in blobs]
    clocked.get_blob(refs[0].digest)          # 0 is now the most recently used
    per_blob = clocked.totals().bytes // 5
    report = collect(clocked, 3 * per_blob + 10)
    assert report.removed_blobs == 2
    present = [clocked.get_blob(r.digest) is not None for r in refs]
    assert present == [True, False, False, True, True]
    assert clocked.totals().bytes <= 3 * per_blob + 10
    assert report.bytes_after == clocked.totals().bytes < report.bytes_before


def test_evicting_a_blob_takes_the_records_that_name_it(tmp_path):
    store = LocalStore(tmp_path / "c", clock=Clock())
    cache = Cache(store)
    shared = os.urandom(20_000)
    cache.store(make_key(1), {"v": 1}, {"cubin": shared})
    cache.store(make_key(2), {"v": 2}, {"cubin": shared, "ptx": b"p" * 100})
    cache.store(make_key(3), {"v": 3}, {"cubin": os.urandom(20_000)})
    for k in (3, 2, 1):
        cache.lookup(make_key(k))   # key 3's entries become the oldest
    collect(store, store.totals().bytes - 1)
    assert cache.lookup(make_key(3)) is None
    assert cache.lookup(make_key(1)) is not None and cache.lookup(make_key(2)) is not None
    collect(store, 1000)
    assert store.totals().records == 0
    assert store.verify().ok
    cache.close()


def test_gc_to_zero_empties_the_store_and_keeps_it_usable(open_cache):
    cache = open_cache()
    for k in range(5):
        cache.store(make_key(k), {"k": k}, {"cubin": os.urandom(5000)})
    report = collect(cache.local, 0)
    assert (report.removed_records, cache.local.totals().bytes) == (5, 0)
    assert list(cache.local.root.glob("cas/*/*")) == []
    cache.store(make_key(9), {"k": 9}, {"cubin": b"x"})
    assert cache.lookup(make_key(9)).value == {"k": 9}


def test_gc_under_the_limit_removes_nothing(open_cache):
    cache = open_cache()
    cache.store(make_key(), {}, {"cubin": b"c"})
    report = collect(cache.local, 1 << 30)
    assert (report.removed_records, report.removed_blobs, report.freed_bytes) == (0, 0, 0)
    assert cache.lookup(make_key()) is not None


def test_gc_removes_temp_files_of_dead_writers(local):
    (local.root / "tmp").mkdir(exist_ok=True)
    (local.root / "tmp" / "999999999-x.part").write_bytes(b"junk")
    (local.root / "tmp" / f"{os.getpid()}-live.part").write_bytes(b"in progress")
    assert collect(local, 1 << 30).temp_removed == 1
    assert [p.name for p in (local.root / "tmp").iterdir()] == [f"{os.getpid()}-live.part"]
