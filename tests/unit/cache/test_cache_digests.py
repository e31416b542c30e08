"""Malformed keys and digests are refused before they touch a path or a URL."""

from __future__ import annotations

import builtins
import os

import pytest
from typer.testing import CliRunner

from .cache_helpers import assert_clean_stderr, cli_env, run_cli
from xgbuild.cache import InvalidDigestError, RemoteStore
from xgbuild.cache.digests import check_digest, is_digest
from xgbuild.cli.cache_cmd import app

GOOD = "0123456789abcdef" * 4
BAD = [
    "../../etc/passwd",
    "",
    "a" * (1 << 20),                      # 1 MB
    GOOD.upper(),
    GOOD[:-1],
    GOOD + "0",
    GOOD[:-1] + "g",
    "../" + GOOD[3:],
    GOOD[:31] + "/" + GOOD[32:],
    GOOD[:-1] + "\n",
    " " + GOOD[1:],
    "ab/../../../../../../etc/passwd" + "0" * 33,
]


def test_a_good_digest_passes():
    assert check_digest(GOOD) == GOOD and is_digest(GOOD)


@pytest.mark.parametrize("bad", BAD + [None, 7, GOOD.encode()], ids=lambda v: repr(v)[:24])
def test_bad_digests_are_refused_with_a_short_message(bad):
    assert not is_digest(bad)
    with pytest.raises(InvalidDigestError) as info:
        check_digest(bad)
    assert len(str(info.value)) < 200    # a 1 MB argument is not echoed back


@pytest.fixture
def no_filesystem_access(monkeypatch):
    """Fail the test if any of the bad names reaches a filesystem call."""
    seen = []

    def guard(real):
        def wrapped(path, *args, **kwargs):
            text = os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
            text = text.decode(errors="replace") if isinstance(text, bytes) else text
            if "passwd" in text or "aaaaaaaaaaaaaaaa" * 8 in text or GOOD.upper() in text:
                seen.append(text[:80])
            return real(path, *args, **kwargs)
        return wrapped

    for name in ("stat", "open", "unlink", "replace", "mkdir", "lstat"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))
    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    return seen


@pytest.mark.parametrize("bad", BAD, ids=lambda v: repr(v)[:24])
def test_local_store_refuses_before_touching_a_path(local, open_cache, bad, tmp_path, no_filesystem_access):
    cache = open_cache()
    calls = [
        lambda: local.get("cas", bad), lambda: local.get("ac", bad),
        lambda: local.put("cas", bad, b"x"), lambda: local.contains("cas", bad),
        lambda: local.contains("ac", bad), lambda: local.get_blob(bad),
        lambda: local.get_record(bad), lambda: local.get_file(bad, tmp_path / "out"),
        lambda: local.delete_blob(bad), lambda: local.delete_record(bad),
        lambda: cache.lookup(bad), lambda: cache.get_blob(bad), lambda: cache.get_record(bad),
        lambda: cache.get_file(bad, tmp_path / "out"),
    ]
    for call in calls:
        with pytest.raises(InvalidDigestError):
            call()
    assert no_filesystem_access == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", BAD, ids=lambda v: repr(v)[:24])
def test_remote_store_refuses_before_building_a_url(fault_server, bad, tmp_path):
    server = fault_server(lambda h: h.reply(200, b"x"))
    remote = RemoteStore(server.url, timeout_s=2)
    for call in (lambda: remote.get("cas", bad), lambda: remote.get("ac", bad),
                 lambda: remote.put("cas", bad, b"x"), lambda: remote.put("ac", bad, b"{}"),
                 lambda: remote.contains("cas", bad),
                 lambda: remote.download_blob(bad, lambda chunk: None)):
        with pytest.raises(InvalidDigestError):
            call()
    assert server.requests == []
    assert remote.available   # a caller's mistake does not trip the breaker


def test_cli_refuses_bad_digests_with_exit_2(tmp_path):
    env = cli_env(tmp_path)
    for args in (["get", "../../etc/passwd", "--out", str(tmp_path / "x")],
                 ["get", "", "--out", str(tmp_path / "x")],
                 ["explain", "../../etc/passwd"],
                 ["diff", "..", GOOD]):
        proc = run_cli(*args, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("error: invalid")
        assert len(proc.stderr.splitlines()) == 1
        assert_clean_stderr(proc.stderr)
    assert not (tmp_path / "x").exists()


def test_cli_refuses_a_1mb_argument_in_one_short_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XG_CACHE_DIR", str(tmp_path / "c"))
    result = CliRunner().invoke(app, ["get", "a" * (1 << 20), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "invalid digest" in result.output and len(result.output) < 300
    assert result.exception is None or isinstance(result.exception, SystemExit)
