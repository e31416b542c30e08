"""Many processes at once, and writers killed with SIGKILL at random points."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import traceback
from pathlib import Path

import pytest

from .cache_helpers import make_key
from xgbuild.cache import Cache, LocalStore, collect

pytestmark = pytest.mark.timeout(300)   # a deadlock fails the test instead of hanging CI

N_PROCS = 8
OPS = 500
N_KEYS = 16
N_BLOBS = 24


def payload(i: int) -> bytes:
    rng = random.Random(i)
    size = rng.choice([0, 1, 100, 4096, 50_000, 200_000])
    # Half random (incompressible), half repetitive, so both zstd paths are exercised.
    return rng.randbytes(size // 2) + bytes([i % 256]) * (size - size // 2)


def record_for(k: int) -> tuple[dict, dict[str, bytes]]:
    return {"k": k, "best": {"BLOCK_M": 64 * (k % 4 + 1)}}, {"cubin": payload(k), "ptx": payload(k + 100)}


def _worker(root: str, seed: int, result: str) -> None:
    """Runs in a forked child: random operations on overlapping keys; exact round trips only."""
    try:
        rng = random.Random(seed)
        cache = Cache(LocalStore(Path(root)))
        counts = {"lookups": 0, "blob_gets": 0, "file_gets": 0}
        for n in range(OPS):
            op = rng.random()
            if op < 0.25:
                i = rng.randrange(N_BLOBS)
                digest = cache.put_blob(payload(i))
                assert digest == hashlib.sha256(payload(i)).hexdigest()
                assert cache.get_blob(digest) == payload(i)
                counts["blob_gets"] += 1
            elif op < 0.45:
                i = rng.randrange(N_BLOBS)
                got = cache.get_blob(hashlib.sha256(payload(i)).hexdigest())
                counts["blob_gets"] += 1
                assert got is None or got == payload(i)
            elif op < 0.65:
                k = rng.randrange(N_KEYS)
                value, blobs = record_for(k)
                cache.store(make_key(k), value, blobs)
                hit = cache.lookup(make_key(k))
                counts["lookups"] += 1
                assert hit is not None and hit.value == value and dict(hit.blobs) == blobs
            elif op < 0.95:
                k = rng.randrange(N_KEYS)
                hit = cache.lookup(make_key(k))
                counts["lookups"] += 1
                if hit is not None:
                    value, blobs = record_for(k)
                    assert hit.value == value and dict(hit.blobs) == blobs
            else:
                i = rng.randrange(N_BLOBS)
                out = Path(root).parent / f"out-{seed}-{n}"
                found = cache.get_file(hashlib.sha256(payload(i)).hexdigest(), out)
                counts["file_gets"] += 1
                assert not found or out.read_bytes() == payload(i)
        cache.close()
        Path(result).write_text(repr(counts))
    except BaseException:
        Path(result).write_text("FAILED\n" + traceback.format_exc())
        os._exit(1)
    os._exit(0)


def test_eight_processes_hammering_overlapping_keys(tmp_path):
    root = tmp_path / "cache"      # created by the racing processes themselves
    ctx = multiprocessing.get_context("fork")
    procs = []
    for seed in range(N_PROCS):
        p = ctx.Process(target=_worker, args=(str(root), seed, str(tmp_path / f"result-{seed}")))
        procs.append(p)
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    results = [(tmp_path / f"result-{seed}").read_text() for seed in range(N_PROCS)]
    failures = [r for r in results if r.startswith("FAILED")]
    assert not failures, failures[0]
    assert [p.exitcode for p in procs] == [0] * N_PROCS

    store = LocalStore(root)
    report = store.verify()
    assert report.ok, report
    assert report.corrupt == report.missing == report.dangling == []
    with Cache(store) as cache:
        for k in range(N_KEYS):
            hit = cache.lookup(make_key(k))
            if hit is not None:
                assert (hit.value, dict(hit.blobs)) == record_for(k)
    counts = [eval(r) for r in results]  # noqa: S307 - our own repr of a dict of ints
    expected_gets = sum(c["lookups"] + c["blob_gets"] + c["file_gets"] for c in counts)
    counters = store.counters()
    assert counters["hits"] + counters["misses"] == expected_gets + N_KEYS


def _gc_loop(root: str, stop: str, result: str) -> None:
    """Evicts down to 300 KiB (a few blobs) over and over until `stop` exists."""
    try:
        store = LocalStore(Path(root))
        rounds = 0
        while not Path(stop).exists() and rounds < 100_000:
            collect(store, 300 << 10)
            rounds += 1
        store.close()
    except BaseException:
        Path(result).write_text("FAILED\n" + traceback.format_exc())
        os._exit(1)
    Path(result).write_text("{}")
    os._exit(0)


def _churn(root: str, seed: int, result: str) -> None:
    """Like `_worker`, but entries may vanish at any moment (a gc runs alongside): misses are
    allowed, wrong bytes are not."""
    try:
        rng = random.Random(seed)
        cache = Cache(LocalStore(Path(root)))
        for _ in range(OPS // 2):
            k = rng.randrange(N_KEYS)
            value, blobs = record_for(k)
            if rng.random() < 0.4:
                cache.store(make_key(k), value, blobs)
            hit = cache.lookup(make_key(k))
            assert hit is None or (hit.value == value and dict(hit.blobs) == blobs)
            i = rng.randrange(N_BLOBS)
            if rng.random() < 0.3:
                cache.put_blob(payload(i))
            got = cache.get_blob(hashlib.sha256(payload(i)).hexdigest())
            assert got is None or got == payload(i)
        cache.close()
        Path(result).write_text("{}")
    except BaseException:
        Path(result).write_text("FAILED\n" + traceback.format_exc())
        os._exit(1)
    os._exit(0)


def test_gc_running_alongside_writers_never_breaks_them(tmp_path):
    root = tmp_path / "cache"
    LocalStore(root).close()
    ctx = multiprocessing.get_context("fork")
    stop = tmp_path / "stop"
    churners = [ctx.Process(target=_churn, args=(str(root), seed, str(tmp_path / f"r{seed}")))
                for seed in range(N_PROCS - 2)]
    collectors = [ctx.Process(target=_gc_loop, args=(str(root), str(stop), str(tmp_path / f"gc{i}")))
                  for i in range(2)]
    procs = churners + collectors
    for p in procs:
        p.start()
    for p in churners:
        p.join(120)
    stop.touch()
    for p in collectors:
        p.join(60)
    results = [f.read_text() for f in sorted(tmp_path.glob("r*")) + sorted(tmp_path.glob("gc*"))]
    failures = [r for r in results if r.startswith("FAILED")]
    assert not failures, failures[0]
    assert [p.exitcode for p in procs] == [0] * N_PROCS
    store = LocalStore(root)
    assert store.counters()["misses"] > 0      # the collectors really did evict under the churners
    report = store.verify()
    assert report.ok, report


def _opener(root: str, barrier, result: str) -> None:
    try:
        barrier.wait(30)
        store = LocalStore(Path(root))
        digest = store.put_blob(b"first open").digest
        assert store.get_blob(digest) == b"first open"
        store.close()
    except BaseException:
        Path(result).write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def test_eight_processes_creating_a_fresh_cache_at_the_same_instant(tmp_path):
    # Regression: SQLite refuses (without waiting) some of the locks that switching a new file to
    # WAL and creating the schema need, when several processes do it at once.
    ctx = multiprocessing.get_context("fork")
    for round_ in range(15):
        barrier = ctx.Barrier(N_PROCS)
        root = tmp_path / f"fresh-{round_}"
        procs = [ctx.Process(target=_opener, args=(str(root), barrier, str(tmp_path / f"r{round_}-{i}")))
                 for i in range(N_PROCS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        errors = [f.read_text() for f in tmp_path.glob(f"r{round_}-*")]
        assert not errors, errors[0]
        assert [p.exitcode for p in procs] == [0] * N_PROCS


def _writer(root: str) -> None:
    """Runs in a forked child until killed: large blobs, streamed files and records."""
    cache = Cache(LocalStore(Path(root)))
    rng = random.Random(os.getpid())
    n = 0
    while True:
        n += 1
        data = rng.randbytes(rng.randrange(1, 2 << 20))
        cache.store(make_key(10_000 + os.getpid() * 1000 + n), {"n": n}, {"blob": data, "tag": b"%d" % n})
        src = Path(root).parent / f"src-{os.getpid()}"
        src.write_bytes(rng.randbytes(rng.randrange(1, 2 << 20)))
        cache.put_file(src)


def _assert_consistent(root: Path) -> dict[str, int]:
    store = LocalStore(root)
    report = store.verify()      # rehashes every blob file: a partial one would show as corrupt
    assert report.ok, report
    assert report.corrupt == report.missing == report.dangling == []
    assert not (root / "tmp").exists() or list((root / "tmp").iterdir()) == []
    # Every visible record is complete: it decodes, and each blob it names is there and hashes right.
    with Cache(store) as cache:
        records = [e.name for e in store.entries() if e.kind == "ac"]
        for key in records:
            hit = cache.lookup(key)
            assert hit is not None, key
            for name, ref in hit.record.blobs.items():
                assert hashlib.sha256(hit.blobs[name]).hexdigest() == ref.digest
        # And the next write after the crash works.
        probe = os.urandom(1 << 20)
        cache.store(make_key(-1), {"after": "crash"}, {"blob": probe})
        assert cache.lookup(make_key(-1)).blobs["blob"] == probe
    return {"temp_removed": report.temp_removed, "adopted": len(report.repaired), "records": len(records)}


@pytest.mark.parametrize("trial", range(20))
def test_a_writer_killed_at_a_random_point_leaves_nothing_partial(tmp_path, trial):
    root = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_writer, args=(str(root),))
    p.start()
    p.join(random.Random(trial).uniform(0.02, 0.35))
    assert p.is_alive(), "the writer died on its own"
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL
    _assert_consistent(root)
