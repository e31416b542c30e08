"""The remote tier against a real nginx, and against servers that misbehave on purpose."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from .cache_helpers import assert_clean_stderr, cli_env, make_key, run_cli
from xgbuild.cache import (CacheKey, RejectedDownloadError, RemoteConfigError, RemoteStore,
                           RemoteUnavailableError)
from xgbuild.cache.records import Record


pytestmark = pytest.mark.timeout(120)   # a hung remote must fail the test, not hang CI


def _blobs(i: int = 0) -> dict[str, bytes]:
    return {"cubin": os.urandom(50000) + bytes([i]), "ptx": b".target sm_90\n" * 20}


# -- happy path on nginx -----------------------------------------------------------------------

def test_two_cache_dirs_share_results_through_one_server(nginx_cache, open_cache):
    writer = open_cache("writer", remote=nginx_cache.url)
    reader = open_cache("reader", remote=nginx_cache.url)
    key, blobs = make_key(1), _blobs(1)
    record = writer.store(key, {"best": {"BLOCK_M": 128}}, blobs)
    # The server holds the raw blobs under cas/ and the record under ac/, Bazel-style.
    for name, ref in record.blobs.items():
        assert (nginx_cache.data / "cas" / ref.digest).read_bytes() == blobs[name]
    assert (nginx_cache.data / "ac" / key.digest).read_bytes() == record.encode()

    hit = reader.lookup(key)
    assert hit is not None and hit.source == "remote"
    assert dict(hit.blobs) == blobs and hit.value == {"best": {"BLOCK_M": 128}}
    assert hit.record.encode() == record.encode()           # byte-identical record
    again = reader.lookup(key)           # unchecked remote records are not kept locally
    assert again.source == "remote" and not again.trusted
    reader.adopt(again)                  # its consumer checked it: kept, marked as such
    kept = reader.lookup(key)
    assert kept.source == "local" and kept.origin == "remote-verified" and dict(kept.blobs) == blobs
    stats = reader.stats()
    assert (stats["hits"], stats["remote_hits"], stats["misses"]) == (3, 2, 0)
    assert reader.local.verify().ok


def test_a_miss_everywhere_is_a_miss(nginx_cache, open_cache, cache_warnings):
    cache = open_cache(remote=nginx_cache.url)
    assert cache.lookup(make_key(99)) is None
    assert cache.stats()["misses"] == 1 and cache_warnings() == []


def test_large_files_stream_through_the_remote(nginx_cache, open_cache, tmp_path):
    src = tmp_path / "big"
    src.write_bytes(os.urandom(3 << 20))
    digest = open_cache("a", remote=nginx_cache.url).put_file(src)
    reader = open_cache("b", remote=nginx_cache.url)
    out = tmp_path / "out"
    assert reader.get_file(digest, out) and out.read_bytes() == src.read_bytes()
    assert reader.local.get_blob(digest) == src.read_bytes()


def test_readers_with_uploads_off_write_nothing(nginx_cache, open_cache):
    reader = open_cache("ci", remote=nginx_cache.url, upload=False)
    reader.store(make_key(2), {"v": 2}, _blobs(2))
    assert not (nginx_cache.data / "ac").exists() and not (nginx_cache.data / "cas").exists()
    open_cache("dev", remote=nginx_cache.url).store(make_key(3), {"v": 3}, _blobs(3))
    assert reader.lookup(make_key(3)).source == "remote"


def test_a_locally_corrupt_blob_is_refetched_from_the_remote(nginx_cache, open_cache, cache_warnings):
    cache = open_cache(remote=nginx_cache.url)
    blobs = _blobs(4)
    record = cache.store(make_key(4), {"v": 4}, blobs)
    digest = record.blobs["cubin"].digest
    path = cache.local.root / "cas" / digest[:2] / digest
    path.write_bytes(path.read_bytes()[:100])
    hit = cache.lookup(make_key(4))
    assert hit is not None and dict(hit.blobs) == blobs
    assert any("refetching" in w for w in cache_warnings())
    assert cache.local.get_blob(digest) == blobs["cubin"]


def test_explain_works_on_a_record_that_only_the_remote_has(nginx_cache, open_cache, tmp_path):
    open_cache("a", remote=nginx_cache.url).store(make_key(5), {"v": 5}, {})
    env = cli_env(tmp_path)
    proc = run_cli("explain", make_key(5).digest, "--remote", nginx_cache.url, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"key {make_key(5).digest}" in proc.stdout and '"id":5' in proc.stdout


# -- poisoned remotes --------------------------------------------------------------------------

def test_nginx_serving_a_poisoned_blob_is_rejected_and_counted(nginx_cache, open_cache, cache_warnings):
    blobs = _blobs(6)
    record = open_cache("a", remote=nginx_cache.url).store(make_key(6), {"v": 6}, blobs)
    digest = record.blobs["cubin"].digest
    (nginx_cache.data / "cas" / digest).write_bytes(b"evil" + blobs["cubin"][4:])
    reader = open_cache("b", remote=nginx_cache.url)
    assert reader.lookup(make_key(6)) is None
    assert reader.stats()["rejected_downloads"] == 1
    assert reader.local.get_blob(digest) is None and reader.local.totals().records == 0
    assert any("rejected" in w for w in cache_warnings())
    reader.store(make_key(7), {"v": 7}, _blobs(7))          # the build goes on
    assert reader.lookup(make_key(7)).source == "local"


def test_a_record_served_under_another_key_is_rejected(nginx_cache, open_cache):
    writer = open_cache("a", remote=nginx_cache.url)
    writer.store(make_key(8), {"v": 8}, {})
    (nginx_cache.data / "ac" / make_key(9).digest).write_bytes(
        (nginx_cache.data / "ac" / make_key(8).digest).read_bytes())
    reader = open_cache("b", remote=nginx_cache.url)
    assert reader.lookup(make_key(9)) is None
    assert reader.stats()["rejected_downloads"] == 1


@pytest.mark.parametrize("kind", ["cas", "ac"])
def test_a_server_returning_wrong_bytes_is_rejected(fault_server, open_cache, kind, cache_warnings):
    other = Record(make_key(10), {"v": 10}, {}).encode()
    server = fault_server(lambda h: h.reply(201) if h.command == "PUT" else
                          h.reply(200, other if "/ac/" in h.path else b"not what you asked for"))
    cache = open_cache(remote=server.url)
    if kind == "cas":
        assert cache.get_blob(hashlib.sha256(b"wanted").hexdigest()) is None
        with pytest.raises(RejectedDownloadError):
            RemoteStore(server.url).get("cas", hashlib.sha256(b"wanted").hexdigest())
    else:
        assert cache.lookup(make_key(11)) is None
    assert cache.stats()["rejected_downloads"] == 1
    assert cache.remote.available                    # poison is counted, not a dead server
    cache.store(make_key(12), {"v": 12}, {"cubin": b"c"})
    assert cache.lookup(make_key(12)).source == "local"
    assert len(cache_warnings()) == 1


def test_a_server_sending_more_than_it_should_is_cut_off(fault_server, open_cache):
    server = fault_server(lambda h: h.reply(200, b"x" * (17 << 20)))
    cache = open_cache(remote=server.url)
    assert cache.lookup(make_key(13)) is None
    assert cache.stats()["rejected_downloads"] == 1


# -- servers that are down, refuse, hang or fail -------------------------------------------------

def _exercise(cache, n: int = 20) -> float:
    """Many lookups and stores; returns the wall time they took."""
    start = time.monotonic()
    for i in range(n):
        assert cache.lookup(make_key(100 + i)) is None
        cache.store(make_key(100 + i), {"i": i}, {"cubin": bytes([i]) * 100})
        assert cache.lookup(make_key(100 + i)).value == {"i": i}
    return time.monotonic() - start


@pytest.mark.parametrize("which", ["refused", "hangs", "http500", "disconnects", "garbage"])
def test_a_broken_remote_costs_one_warning_and_at_most_the_timeout(
        which, refused_url, hanging_url, fault_server, open_cache, cache_warnings):
    def drop(h):
        h.close_connection = True
        h.connection.close()

    def garbage(h):
        h.wfile.write(b"this is not HTTP\r\n\r\n")
        h.close_connection = True

    url = {
        "refused": lambda: refused_url,
        "hangs": lambda: hanging_url,
        "http500": lambda: fault_server(lambda h: h.reply(500, b"oops")).url,
        "disconnects": lambda: fault_server(drop).url,
        "garbage": lambda: fault_server(garbage).url,
    }[which]()
    timeout = 0.5
    cache = open_cache(remote=url, timeout_s=timeout)
    elapsed = _exercise(cache)
    assert elapsed < timeout + 3.0      # one timeout at most, then the breaker keeps it away
    warnings = cache_warnings()
    assert len(warnings) == 1, warnings
    assert "local cache only" in warnings[0]
    assert cache.stats()["remote_errors"] == 1
    assert not cache.remote.available and cache.local.verify().ok


def test_the_cli_survives_a_dead_remote_with_one_warning(refused_url, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"payload")
    env = cli_env(tmp_path, XG_REMOTE_CACHE=refused_url, XG_REMOTE_TIMEOUT="1")
    proc = run_cli("put", str(src), env=env)
    assert proc.returncode == 0
    assert proc.stdout.strip() == hashlib.sha256(b"payload").hexdigest()
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("warning: ")
    assert_clean_stderr(proc.stderr)
    out = tmp_path / "out"
    proc = run_cli("get", proc.stdout.strip(), "--out", str(out), env=env)
    assert proc.returncode == 0 and out.read_bytes() == b"payload"


def test_the_cli_reports_a_miss_with_a_dead_remote(hanging_url, tmp_path):
    env = cli_env(tmp_path, XG_REMOTE_CACHE=hanging_url, XG_REMOTE_TIMEOUT="0.5")
    start = time.monotonic()
    proc = run_cli("get", "ab" * 32, "--out", str(tmp_path / "x"), env=env)
    assert time.monotonic() - start < 20
    assert proc.returncode == 1 and "not in" in proc.stderr
    assert_clean_stderr(proc.stderr)


# -- authentication ----------------------------------------------------------------------------

def test_uploads_without_the_token_fail_clearly_and_reads_still_work(
        nginx_token_cache, open_cache, cache_warnings):
    anonymous = open_cache("anon", remote=nginx_token_cache.url)
    anonymous.store(make_key(20), {"v": 20}, _blobs(20))
    assert anonymous.lookup(make_key(20)).source == "local"        # the local write succeeded
    assert "uploads need a token" in anonymous.upload_error
    warnings = cache_warnings()
    assert len(warnings) == 1 and "uploads need a token" in warnings[0] and "401" in warnings[0]
    anonymous.store(make_key(21), {"v": 21}, {})                   # no second try, no second warning
    assert len(cache_warnings()) == 1
    assert not (nginx_token_cache.data / "ac").exists()

    member = open_cache("member", remote=nginx_token_cache.url, header=nginx_token_cache.header())
    member.store(make_key(22), {"v": 22}, _blobs(22))
    assert member.upload_error is None
    assert anonymous.lookup(make_key(22)).source == "remote"       # reads need no token
    assert anonymous.stats()["upload_errors"] == 1


def test_a_wrong_token_is_refused_too(nginx_token_cache, open_cache):
    cache = open_cache(remote=nginx_token_cache.url, header=("Authorization", "Bearer wrong-token"))
    cache.put_blob(b"x")
    assert cache.upload_error and "401" in cache.upload_error


def test_the_cli_put_without_a_token_exits_1_but_keeps_the_local_copy(nginx_token_cache, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"needs a token")
    env = cli_env(tmp_path, XG_REMOTE_CACHE=nginx_token_cache.url)
    proc = run_cli("put", str(src), env=env)
    assert proc.returncode == 1
    assert proc.stdout.strip() == hashlib.sha256(b"needs a token").hexdigest()
    assert "uploads need a token" in proc.stderr
    assert_clean_stderr(proc.stderr)
    env["XG_REMOTE_CACHE_HEADER"] = f"Authorization: Bearer {nginx_token_cache.token}"
    proc = run_cli("put", str(src), env=env)
    assert proc.returncode == 0 and proc.stderr == ""
    assert (nginx_token_cache.data / "cas" / proc.stdout.strip()).read_bytes() == b"needs a token"


def test_a_malformed_header_is_a_usage_error(tmp_path):
    env = cli_env(tmp_path, XG_REMOTE_CACHE="http://127.0.0.1:9", XG_REMOTE_CACHE_HEADER="Bearer s3cret")
    proc = run_cli("stats", env=env)
    assert proc.returncode == 2 and "expected 'Name: value'" in proc.stderr
    assert "s3cret" not in proc.stderr
    assert_clean_stderr(proc.stderr)


@pytest.mark.parametrize("url", ["ftp://host/x", "not a url", "http://", "http://u:p@host/",
                                 "http://host/?q=1", "http://host:99999/"])
def test_bad_remote_urls_are_refused(url):
    with pytest.raises(RemoteConfigError):
        RemoteStore(url)


def test_remote_store_contract(nginx_cache):
    remote = RemoteStore(nginx_cache.url + "/", timeout_s=5)
    data = b"contract"
    digest = hashlib.sha256(data).hexdigest()
    assert remote.get("cas", digest) is None and not remote.contains("cas", digest)
    remote.put("cas", digest, data)
    assert remote.contains("cas", digest) and remote.get("cas", digest) == data
    key = CacheKey(kernel_ir="k", shapes=[], dtypes=[], gpu_profile={}, search_space={}, policy="p")
    rec = Record(key, {"ok": True}, {}).encode()
    remote.put("ac", key.digest, rec)
    assert remote.get("ac", key.digest) == rec
    assert remote.url == nginx_cache.url


def test_a_down_remote_fails_fast_after_the_first_error(refused_url):
    remote = RemoteStore(refused_url, timeout_s=1)
    with pytest.raises(RemoteUnavailableError, match="refused"):
        remote.get("cas", "ab" * 32)
    start = time.monotonic()
    for _ in range(100):
        with pytest.raises(RemoteUnavailableError):
            remote.get("cas", "ab" * 32)
    assert time.monotonic() - start < 1.0
