"""The local store: round trips, on-disk layout, corruption handling, verify, schema, settings."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
import zstandard

from .cache_helpers import make_key
from xgbuild.cache import Cache, CacheError, CorruptEntryError, LocalStore, SchemaError
from xgbuild.cache.errors import MissingBlobsError
from xgbuild.cache.records import BlobRef, Record
from xgbuild.settings import Settings

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@pytest.mark.parametrize("size", [0, 1, 4096, 1 << 20, 3 * (1 << 20) + 7])
def test_blob_round_trip_is_exact(local, size):
    data = os.urandom(size)
    ref = local.put_blob(data)
    assert ref == BlobRef(hashlib.sha256(data).hexdigest(), size)
    assert local.get_blob(ref.digest) == data
    assert local.get("cas", ref.digest) == data
    assert local.contains("cas", ref.digest)


def test_blobs_are_zstd_files_under_their_hash(local):
    data = b"compressible " * 10000
    ref = local.put_blob(data)
    path = local.root / "cas" / ref.digest[:2] / ref.digest
    frame = path.read_bytes()
    assert frame.startswith(ZSTD_MAGIC) and len(frame) < len(data) // 10
    assert zstandard.ZstdDecompressor().decompress(frame) == data
    assert list((local.root / "tmp").iterdir()) == []


def test_put_is_idempotent_and_deduplicated(local):
    a = local.put_blob(b"same")
    b = local.put_blob(b"same")
    assert a == b and local.totals().blobs == 1


def test_missing_blob_is_none(local):
    assert local.get_blob("ab" * 32) is None
    assert not local.contains("cas", "ab" * 32)
    assert local.get_record("cd" * 32) is None


def test_file_round_trip_streams_and_writes_atomically(local, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(5 * (1 << 20) + 3))
    ref = local.put_file(src)
    assert ref.digest == hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "out.bin"
    assert local.get_file(ref.digest, out)
    assert out.read_bytes() == src.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    assert not local.get_file("00" * 32, tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_record_round_trip(open_cache):
    cache = open_cache()
    key = make_key(1)
    value = {"best": {"BLOCK_M": 128, "num_warps": 8}, "ms": 0.0123, "tuned": "measured"}
    blobs = {"cubin": os.urandom(70000), "ptx": b".version 8.0\n"}
    record = cache.store(key, value, blobs)
    assert record.digest == key.digest
    hit = cache.lookup(key)
    assert hit is not None and hit.source == "local"
    assert hit.key == key and hit.value == value and dict(hit.blobs) == blobs
    assert cache.lookup(key.digest).blobs == hit.blobs
    assert cache.lookup(make_key(2)) is None
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["records"], stats["blobs"]) == (2, 1, 1, 2)


def test_record_bytes_verify_themselves(local):
    key = make_key(4)
    ref = local.put_blob(b"cubin")
    data = Record(key, {"x": 1}, {"cubin": ref}).encode()
    local.put("ac", key.digest, data)
    assert local.get("ac", key.digest) == data
    with pytest.raises(CorruptEntryError):   # parts that hash to another key
        local.put("ac", make_key(5).digest, data)
    with pytest.raises(CorruptEntryError):   # a flipped byte fails the record's own check
        local.put("ac", key.digest, data.replace(b'"x":1', b'"x":2'))


def test_a_record_needs_its_blobs_first(local):
    missing = BlobRef(hashlib.sha256(b"never stored").hexdigest(), 12)
    with pytest.raises(MissingBlobsError, match="not in the store"):
        local.put_record(Record(make_key(), {}, {"cubin": missing}))
    assert local.totals().records == 0


def test_restoring_a_key_replaces_its_record(open_cache):
    cache = open_cache()
    cache.store(make_key(), {"v": 1}, {"cubin": b"one"})
    cache.store(make_key(), {"v": 2}, {"cubin": b"two"})
    hit = cache.lookup(make_key())
    assert hit.value == {"v": 2} and hit.blobs == {"cubin": b"two"}


def _blob_path(store: LocalStore, digest: str) -> Path:
    return store.root / "cas" / digest[:2] / digest


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


CORRUPTIONS = {
    "flipped byte": _flip,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "other content": lambda p: p.write_bytes(zstandard.ZstdCompressor().compress(b"x" * 100000)),
    "not zstd": lambda p: p.write_bytes(b"garbage that is no zstd frame"),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_corrupt_blob_is_refused_and_dropped(local, how):
    data = os.urandom(100000)
    ref = local.put_blob(data)
    CORRUPTIONS[how](_blob_path(local, ref.digest))
    with pytest.raises(CorruptEntryError, match="dropped"):
        local.get_blob(ref.digest)
    assert not _blob_path(local, ref.digest).exists()
    assert local.get_blob(ref.digest) is None
    assert local.counters()["corrupt_dropped"] == 1
    assert local.put_blob(data) == ref and local.get_blob(ref.digest) == data


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_get_file_never_writes_wrong_bytes(local, tmp_path, how):
    ref = local.put_blob(os.urandom(300000))
    CORRUPTIONS[how](_blob_path(local, ref.digest))
    out = tmp_path / "out"
    with pytest.raises(CorruptEntryError):
        local.get_file(ref.digest, out)
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_lookup_with_a_corrupt_blob_is_a_miss_with_a_warning(open_cache, cache_warnings):
    cache = open_cache()
    record = cache.store(make_key(), {"v": 1}, {"cubin": os.urandom(5000)})
    _flip(_blob_path(cache.local, record.blobs["cubin"].digest))
    assert cache.lookup(make_key()) is None
    assert any("dropped" in w for w in cache_warnings())
    assert cache.local.get_record(make_key().digest) is None   # its record went with it
    assert cache.local.verify().ok


def test_verify_drops_corrupt_entries_and_reports_them(open_cache):
    cache = open_cache()
    good = cache.store(make_key(1), {"v": 1}, {"cubin": b"good" * 1000})
    bad = cache.store(make_key(2), {"v": 2}, {"cubin": b"bad" * 1000})
    _flip(_blob_path(cache.local, bad.blobs["cubin"].digest))
    report = cache.local.verify()
    assert not report.ok
    assert [line.split(":")[0] for line in report.corrupt] == [f"cas {bad.blobs['cubin'].digest}"]
    assert report.blobs_checked == 2 and report.records_checked == 2
    assert cache.lookup(make_key(2)) is None
    assert cache.lookup(make_key(1)).value == good.value
    assert cache.local.verify().ok   # dropped, so the next run is clean


def test_verify_drops_a_corrupt_record(open_cache):
    cache = open_cache()
    cache.store(make_key(1), {"v": 1}, {})
    with sqlite3.connect(cache.local.index.path) as db:
        db.execute("UPDATE actions SET record = replace(record, '\"v\":1', '\"v\":9')")
    report = cache.local.verify()
    assert not report.ok and report.corrupt[0].startswith(f"ac {make_key(1).digest}")
    assert cache.lookup(make_key(1)) is None


def test_a_corrupt_record_is_never_returned(open_cache, cache_warnings):
    cache = open_cache()
    cache.store(make_key(1), {"v": 1}, {})
    with sqlite3.connect(cache.local.index.path) as db:
        db.execute("UPDATE actions SET record = substr(record, 1, 40)")
    assert cache.lookup(make_key(1)) is None
    assert cache_warnings() and cache.local.counters()["corrupt_dropped"] == 1


def test_verify_reports_indexed_blobs_whose_file_vanished(open_cache):
    cache = open_cache()
    rec = cache.store(make_key(), {}, {"cubin": b"c" * 100})
    _blob_path(cache.local, rec.blobs["cubin"].digest).unlink()
    report = cache.local.verify()
    assert not report.ok and len(report.missing) == 1
    assert cache.local.totals().records == 0 and cache.local.verify().ok


def test_verify_adopts_orphans_and_removes_stale_temp_files(local):
    data = b"orphan" * 100
    digest = hashlib.sha256(data).hexdigest()
    local.files.write_bytes(digest, data)            # a writer died before its index row
    (local.root / "tmp").mkdir(exist_ok=True)
    (local.root / "tmp" / "999999999-dead.part").write_bytes(b"partial")
    report = local.verify()
    assert report.ok and report.temp_removed == 1 and report.repaired == [f"cas {digest}: indexed"]
    assert local.totals().blobs == 1 and local.get_blob(digest) == data


def test_verify_removes_foreign_files_from_the_blob_tree(local):
    local.put_blob(b"x")
    (local.root / "cas" / "zz").mkdir()
    (local.root / "cas" / "zz" / "../../etc/passwd".replace("/", "_")).write_bytes(b"x")
    report = local.verify()
    assert not report.ok and "unexpected file" in report.corrupt[0]
    assert local.verify().ok


def test_index_uses_wal_and_a_schema_version(local):
    with sqlite3.connect(local.index.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0] == "1"
    assert local.index.busy_timeout_s > 0


def test_a_newer_schema_is_refused_clearly(tmp_path):
    LocalStore(tmp_path / "c").close()
    with sqlite3.connect(tmp_path / "c" / "index.sqlite") as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(SchemaError, match="schema version 99"):
        LocalStore(tmp_path / "c")


def test_an_index_that_is_not_sqlite_is_a_clear_error(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "index.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match="damaged"):
        LocalStore(tmp_path / "c")


def test_cache_dir_follows_settings(tmp_path):
    env = {"HOME": str(tmp_path / "home")}
    assert Settings.from_env(env).cache_dir == tmp_path / "home" / ".cache" / "xg"
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert Settings.from_env(env).cache_dir == tmp_path / "xdg" / "xg"
    env["XG_CACHE_DIR"] = str(tmp_path / "explicit")
    settings = Settings.from_env(env)
    with Cache.open(settings) as cache:
        cache.put_blob(b"x")
    assert (tmp_path / "explicit" / "index.sqlite").exists()


def test_a_fork_gets_its_own_connection(local):
    local.put_blob(b"parent")
    pid = os.fork()
    if pid == 0:   # pragma: no cover - runs in the child
        try:
            ok = local.get_blob(local.put_blob(b"child").digest) == b"child"
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert local.get_blob(hashlib.sha256(b"child").hexdigest()) == b"child"
