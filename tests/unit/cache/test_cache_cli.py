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
    assert code == 1 and out.splitlines()[0] == "parts that differ: kernel_ir, shapes"
    assert "  shapes.A:\n    - [128,64]\n    + [256,64]" in out
    assert json.loads(cli("diff", k1, k2, "--json")[1]) == [
        {"path": "kernel_ir.id", "left": "1", "right": "2"},
        {"path": "shapes.A", "left": "[128,64]", "right": "[256,64]"},
    ]
    assert cli("diff", k1, k1)[:2] == (0, "the keys have identical parts\n")
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


# -- forensics (issue 25: a miss ends in an answer) ----------------------------------------------

def test_diff_exits_1_when_the_keys_differ_and_0_when_equal(cli, tmp_path):
    _seed(tmp_path).close()
    assert cli("diff", K1.digest, K2.digest)[0] == 1
    assert cli("diff", K1.digest, K2.digest, "--json")[0] == 1
    assert cli("diff", K1.digest, K1.digest)[0] == 0
    assert cli("diff", K1.digest, K1.digest, "--json")[:2] == (0, "[]\n")


def test_explain_and_diff_take_a_unique_prefix(cli, tmp_path):
    _seed(tmp_path).close()
    code, out, _ = cli("explain", K1.digest[:12])
    assert code == 0 and out.splitlines()[0] == f"key {K1.digest}"
    code, out, _ = cli("diff", K1.digest[:8], K2.digest[:8])
    assert code == 1 and out.splitlines()[0] == "parts that differ: kernel_ir, shapes"


def test_an_unknown_prefix_exits_1_and_a_malformed_one_2(cli, tmp_path):
    _seed(tmp_path).close()
    unknown = next(p for p in ("0000", "ffff", "abab") if not (K1.digest.startswith(p) or K2.digest.startswith(p)))
    code, out, err = cli("explain", unknown)
    assert code == 1 and out == "" and f"no record in the local cache has a key starting with {unknown}" in err
    assert len(err.strip().splitlines()) == 1
    for bad in ("abc", "XYZW", "ABCDEF12"):
        code, _, err = cli("diff", bad, K1.digest)
        assert code == 2 and "invalid key" in err and "unique prefix" in err


def test_an_ambiguous_prefix_exits_2_listing_the_keys(cli, tmp_path):
    seen: dict[str, object] = {}
    for i in range(100_000):
        k = make_key(i)
        if k.digest[:4] in seen:
            a, b = seen[k.digest[:4]], k
            break
        seen[k.digest[:4]] = k
    cache = Cache(LocalStore(tmp_path / "cache"))
    cache.store(a, {"best": 1})
    cache.store(b, {"best": 2})
    cache.close()
    code, out, err = cli("explain", a.digest[:4])
    assert code == 2 and out == "" and "is ambiguous" in err and a.digest in err and b.digest in err


def test_ls_names_each_records_kernel(cli, tmp_path):
    key = make_key(3, kernel_ir={"kind": "matmul", "spec": 1}, shapes={"sizes": {"M": 64, "N": 32}, "layouts": []},
                   dtypes=["bfloat16", "bfloat16"], gpu_profile={"name": "H100"})
    cache = Cache(LocalStore(tmp_path / "cache"))
    cache.store(key, {"how": "measured"})
    cache.store(make_key(4, **{**{"kernel_ir": {"kind": "matmul", "spec": 2}}}), {"how": "predicted"})
    cache.close()
    code, out, _ = cli("ls")
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("ac ")}
    assert code == 0 and rows[key.digest].endswith("  tuned-kernel matmul M=64 N=32 bfloat16,bfloat16 H100")
    assert any(line.endswith("(predicted)") for line in rows.values())
    entries = {e["name"]: e for e in json.loads(cli("ls", "--json")[1]) if e["kind"] == "ac"}
    assert entries[key.digest]["kernel"] == {"kind": "tuned-kernel", "op": "matmul", "shape": "M=64 N=32",
                                             "dtype": "bfloat16,bfloat16", "gpu": "H100"}
    assert entries[key.digest]["predicted"] is False


def test_a_predicted_key_explains_and_diffs_against_its_nearest_measured_neighbour(cli, tmp_path):
    measured = make_key(5, kernel_ir={"kind": "matmul"}, toolchain={"triton": "3.5.1"})
    predicted = make_key(5, kernel_ir={"kind": "matmul"}, toolchain={"triton": "3.6.0"})
    cache = Cache(LocalStore(tmp_path / "cache"))
    cache.store(measured, {"how": "measured", "config": {"BLOCK_M": 64}})
    cache.store(predicted, {"how": "predicted", "config": {"BLOCK_M": 128}})
    cache.close()
    code, out, _ = cli("explain", predicted.digest)
    assert code == 0 and "  predicted: the cost model's pick" in out
    assert f"  nearest measured key {measured.digest} differs in: toolchain" in out
    assert json.loads(cli("explain", predicted.digest, "--json")[1])["nearest_measured"] == {
        "key": measured.digest, "differs_in": ["toolchain"]}
    code, out, _ = cli("diff", predicted.digest)          # one key: against its nearest neighbour
    assert code == 1 and out.splitlines()[:2] == [f"nearest stored key: {measured.digest} (tuned-kernel matmul "
                                                  "A=[128,64] B=[64,32] A:float16,B:float16,out:float32 H100)",
                                                  "parts that differ: toolchain"]
    assert '  toolchain.triton:\n    - "3.6.0"\n    + "3.5.1"' in out
    code, _, err = cli("diff", make_key(6, kind="other").digest)
    assert code == 1 and "no record for key" in err
