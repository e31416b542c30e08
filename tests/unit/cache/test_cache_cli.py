"""`xgbuild cache …`: output formats, exit codes, and no tracebacks."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from .cache_helpers import assert_clean_stderr, cli_env, make_key, run_cli
from xgbuild.cache import Cache, LocalStore
from xgbuild.cli.cache_cmd import app


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """Invoke the typer app in-process with a private cache dir; returns (exit code, out, err)."""
    for name in ("XG_CACHE_DIR", "XG_REMOTE_CACHE", "XG_REMOTE_CACHE_HEADER", "XG_NO_REMOTE_UPLOAD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XG_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()

    def invoke(*args: str):
        result = runner.invoke(app, list(args))
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        return result.exit_code, result.stdout, result.stderr

    return invoke


def _file(tmp_path: Path, data: bytes, name: str = "f") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_put_prints_the_digest_alone_and_get_returns_the_bytes(cli, tmp_path):
    data = os.urandom(200_000)
    code, out, err = cli("put", str(_file(tmp_path, data)))
    assert (code, err) == (0, "") and out == hashlib.sha256(data).hexdigest() + "\n"
    code, out, err = cli("get", out.strip(), "--out", str(tmp_path / "back"))
    assert (code, out, err) == (0, "", "")
    assert (tmp_path / "back").read_bytes() == data


def test_get_to_stdout(tmp_path):
    env = cli_env(tmp_path)
    digest = run_cli("put", str(_file(tmp_path, b"to stdout")), env=env).stdout.strip()
    proc = run_cli("get", digest, "--out", "-", env=env)
    assert proc.returncode == 0 and proc.stdout == "to stdout"


def test_get_of_an_absent_blob_exits_1(cli, tmp_path):
    code, out, err = cli("get", "ab" * 32, "--out", str(tmp_path / "x"))
    assert code == 1 and out == "" and err.startswith("error: blob ") and "not in the local cache" in err
    assert not (tmp_path / "x").exists()


def test_cache_dir_flag_beats_the_environment(cli, tmp_path):
    code, out, _ = cli("put", str(_file(tmp_path, b"flag")), "--cache-dir", str(tmp_path / "other"))
    assert code == 0 and (tmp_path / "other" / "index.sqlite").exists()
    assert not (tmp_path / "cache").exists()
    assert cli("get", out.strip(), "--out", str(tmp_path / "o"))[0] == 1
    other = str(tmp_path / "other")
    assert cli("get", out.strip(), "--out", str(tmp_path / "o"), "--cache-dir", other)[0] == 0


K1 = make_key(1)
K2 = make_key(2, shapes={"A": [256, 64], "B": [64, 32]})


def _seed(tmp_path: Path) -> Cache:
    cache = Cache(LocalStore(tmp_path / "cache"))
    cache.store(K1, {"best": 1}, {"cubin": b"one" * 100})
    cache.store(K2, {"best": 2}, {"cubin": b"two"})
    return cache


def test_ls_and_stats(cli, tmp_path):
    _seed(tmp_path).close()
    code, out, _ = cli("ls")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4
    assert sorted(line.split()[0] for line in lines) == ["ac", "ac", "cas", "cas"]
    code, out, _ = cli("ls", "--json")
    entries = json.loads(out)
    assert {e["name"] for e in entries if e["kind"] == "ac"} == {K1.digest, K2.digest}
    code, out, _ = cli("stats", "--json")
    stats = json.loads(out)
    for field in ("entries", "bytes", "hits", "misses", "remote_errors", "rejected_downloads"):
        assert field in stats
    assert (stats["entries"], stats["records"], stats["blobs"]) == (4, 2, 2)
    code, out, _ = cli("stats")
    assert code == 0 and "rejected downloads: 0" in out and "entries:            4" in out


def test_verify_exit_codes(cli, tmp_path):
    cache = _seed(tmp_path)
    code, out, _ = cli("verify")
    assert code == 0 and out.strip().endswith(": ok")
    digest = cache.lookup(K1).record.blobs["cubin"].digest
    path = tmp_path / "cache" / "cas" / digest[:2] / digest
    path.write_bytes(b"rotten")
    cache.close()
    code, out, _ = cli("verify")
    assert code == 1 and f"dropped cas {digest}" in out
    code, out, _ = cli("verify", "--json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_gc_command(cli, tmp_path):
    _seed(tmp_path).close()
    code, out, _ = cli("gc", "--max-size", "0")
    assert code == 0 and out.startswith("removed 2 records and 2 blobs")
    code, out, _ = cli("gc", "--max-size", "10M", "--json")
    assert code == 0 and json.loads(out)["removed_blobs"] == 0
    code, _, err = cli("gc", "--max-size", "lots")
    assert code == 2 and "invalid size" in err


def test_explain_and_diff(cli, tmp_path):
    _seed(tmp_path).close()
    k1, k2 = K1.digest, K2.digest
    code, out, _ = cli("explain", k1)
    assert code == 0 and out.splitlines()[0] == f"key {k1}"
    assert '  shapes: {"A":[128,64],"B":[64,32]}' in out and "  blob cubin: " in out
    parts = json.loads(cli("explain", k1, "--json")[1])["parts"]
    assert parts["gpu_profile"]["sm"] == 90
    code, out, _ = cli("diff", k1, k2)
    assert code == 0 and out.splitlines()[0] == "parts that differ: kernel_ir, shapes"
    assert "  shapes.A:\n    - [128,64]\n    + [256,64]" in out
    assert json.loads(cli("diff", k1, k2, "--json")[1]) == [
        {"path": "kernel_ir.id", "left": "1", "right": "2"},
        {"path": "shapes.A", "left": "[128,64]", "right": "[256,64]"},
    ]
    assert cli("diff", k1, k1)[1] == "the keys have identical parts\n"
    code, _, err = cli("explain", "ef" * 32)
    assert code == 1 and "no record for key" in err


def test_errors_are_one_line_without_tracebacks(tmp_path):
    env = cli_env(tmp_path)
    cases = [
        (["put", str(tmp_path / "missing")], 2),
        (["get", "ab" * 32, "--out", str(tmp_path / "no" / "such" / "dir")], 1),
        (["gc"], 2),
        (["explain", "zz"], 2),
        (["stats", "--cache-dir", str(_file(tmp_path, b"a file, not a dir", "notadir"))], 2),
    ]
    for args, code in cases:
        proc = run_cli(*args, env=env)
        assert proc.returncode == code, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_a_bad_environment_is_a_usage_error(tmp_path):
    env = cli_env(tmp_path, XG_REMOTE_TIMEOUT="soon")
    proc = run_cli("stats", env=env)
    assert proc.returncode == 2 and "XG_REMOTE_TIMEOUT" in proc.stderr
    assert_clean_stderr(proc.stderr)
    env = cli_env(tmp_path, XG_REMOTE_CACHE="ftp://example")
    proc = run_cli("put", str(_file(tmp_path, b"x")), env=env)
    assert proc.returncode == 2 and "http://" in proc.stderr
    assert_clean_stderr(proc.stderr)
