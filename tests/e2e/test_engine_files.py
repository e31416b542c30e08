"""Engine files end to end: reproducible bytes, refusal of anything damaged, `xgbuild inspect`.

The reproducibility test builds one program with `xgc --out` in two processes that differ in
every way the design says must not matter: directory (and its name), hash seed, time zone,
locale and umask. The damage tests flip bytes, truncate, feed garbage and re-pack an engine
claiming a newer format; `xgrun` must refuse each with exit 1 and one clear line, `xg.load_engine`
with `EngineError`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
import torch
from conftest import (EXAMPLE_NAMES, EXAMPLES, Rand, assert_clean_failure, cli, finish, process_env, src_text,
                      start_process, write_program)

import xg
from xgbuild.packager.archive import read_bundle, write_bundle
from xgbuild.packager.manifest import canonical_json

# ------------------------------------------------------------------------------ reproducible bytes

def test_same_engine_bytes_from_different_directories_and_environments(tmp_path) -> None:
    builds = []
    settings = [("alpha", "1", "UTC", "C.UTF-8", 0o022), ("a_much_longer_directory_name", "4242",
                                                          "Asia/Kolkata", "C", 0o077)]
    procs = []
    for parent, hashseed, tz, locale, umask in settings:
        workdir = tmp_path / parent / "src"
        workdir.mkdir(parents=True)
        shutil.copy(EXAMPLES / "contract.xg", workdir / "contract.xg")
        out = tmp_path / parent / "build" / "engine.xge"
        env = process_env(PYTHONHASHSEED=hashseed, TZ=tz, LC_ALL=locale, LANG=locale)
        procs.append(start_process("xgc", "contract.xg", "--out", out, cwd=workdir, env=env, umask=umask))
        builds.append(out)
    for proc in procs:
        res = finish(proc)
        assert res.code == 0, res.both
    first, second = (p.read_bytes() for p in builds)
    assert first == second, "two builds of the same source differ"
    # ...and the same bytes as this process writes through the API.
    here = tmp_path / "api.xge"
    xg.compile_file(EXAMPLES / "contract.xg").save(here)
    assert here.read_bytes() == first


def test_saving_twice_gives_the_same_bytes_and_digest(tmp_path, example_engines) -> None:
    engine = example_engines["attention"]
    d1, d2 = engine.save(tmp_path / "one.xge"), engine.save(tmp_path / "two.xge")
    assert d1 == d2 == engine.digest
    assert (tmp_path / "one.xge").read_bytes() == (tmp_path / "two.xge").read_bytes()


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_save_load_round_trip(name: str, tmp_path, example_engines) -> None:
    engine = example_engines[name]
    engine.save(tmp_path / "e.xge")
    loaded = xg.load_engine(tmp_path / "e.xge")
    assert loaded.digest == engine.digest and loaded.manifest == engine.manifest
    assert loaded.graph == engine.graph


def test_loaded_engine_computes_the_same_values(tmp_path, example_engines, rand: Rand) -> None:
    engine = example_engines["norms"]
    engine.save(tmp_path / "n.xge")
    x, g = rand.tensor((5, 7))[0], rand.tensor((7,))[0]
    a = engine.run({"X": x, "G": g}).value
    b = xg.load_engine(tmp_path / "n.xge").run({"X": x, "G": g}).value
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------ damaged engines

@pytest.fixture
def engine_bytes(example_files) -> bytes:
    return example_files["norms"].read_bytes()


def test_every_flipped_byte_is_refused_by_load_engine(tmp_path, engine_bytes) -> None:
    path = tmp_path / "flipped.xge"
    for position in range(len(engine_bytes)):
        data = bytearray(engine_bytes)
        data[position] ^= 0x01 if position % 2 else 0x80
        path.write_bytes(bytes(data))
        with pytest.raises(xg.EngineError):
            xg.load_engine(path)
            pytest.fail(f"a flipped byte at {position} of {len(engine_bytes)} was accepted")


@pytest.mark.parametrize("where", ["start", "frame-header", "middle", "seal", "last"])
def test_xgrun_refuses_a_flipped_byte(where: str, tmp_path, engine_bytes) -> None:
    n = len(engine_bytes)
    position = {"start": 0, "frame-header": 5, "middle": n // 2, "seal": n - 40, "last": n - 1}[where]
    data = bytearray(engine_bytes)
    data[position] ^= 0xFF
    path = tmp_path / "flipped.xge"
    path.write_bytes(bytes(data))
    res = cli("xgrun", path)
    assert_clean_failure(res, str(path))
    assert any(word in res.err for word in ("corrupt", "not an XG engine", "damaged")), res.err


@pytest.mark.parametrize("keep", [0, 1, 4, 100, -1])
def test_truncated_engine(keep: int, tmp_path, engine_bytes) -> None:
    path = tmp_path / "cut.xge"
    path.write_bytes(engine_bytes[:keep])
    with pytest.raises(xg.EngineError):
        xg.load_engine(path)
    assert_clean_failure(cli("xgrun", path), str(path))


@pytest.mark.parametrize("content", [b"", b"hello, this is not an engine\n", b"PK\x03\x04" + bytes(200)])
def test_corrupt_engine(content: bytes, tmp_path) -> None:
    path = tmp_path / "junk.xge"
    path.write_bytes(content)
    with pytest.raises(xg.EngineError):
        xg.load_engine(path)
    assert_clean_failure(cli("xgrun", path), str(path))


def test_engine_path_is_a_directory(tmp_path) -> None:
    with pytest.raises(xg.EngineError, match="directory"):
        xg.load_engine(tmp_path)
    assert_clean_failure(cli("xgrun", tmp_path), "directory")


def repack(src, dst, edit) -> None:
    """Re-pack an engine with its entries edited: a well-formed, sealed archive with other contents."""
    entries = dict(read_bundle(src).entries)
    edit(entries)
    write_bundle(dst, entries)


def test_engine_from_a_newer_format(tmp_path, example_files) -> None:
    def bump(entries):
        manifest = json.loads(entries["manifest.json"])
        manifest["format_version"] = 2
        entries["manifest.json"] = canonical_json(manifest)

    path = tmp_path / "future.xge"
    repack(example_files["norms"], path, bump)
    with pytest.raises(xg.EngineError, match="format version 2, newer"):
        xg.load_engine(path)
    res = cli("xgrun", path)
    assert_clean_failure(res, str(path), "format version 2", "upgrade")


def test_engine_whose_program_does_not_match_its_manifest(tmp_path, example_files) -> None:
    def swap(entries):
        entries["program.json"] = read_bundle(example_files["mlp"]).entries["program.json"]

    path = tmp_path / "swapped.xge"
    repack(example_files["norms"], path, swap)
    with pytest.raises(xg.EngineError, match="program.json does not match"):
        xg.load_engine(path)
    assert_clean_failure(cli("xgrun", path), "program.json")


def test_archive_without_a_manifest_is_not_an_engine(tmp_path, example_files) -> None:
    path = tmp_path / "nomanifest.xge"
    repack(example_files["norms"], path, lambda entries: entries.pop("manifest.json"))
    with pytest.raises(xg.EngineError, match="not an XG engine"):
        xg.load_engine(path)
    assert_clean_failure(cli("xgbuild", "inspect", path), "manifest.json")


# ------------------------------------------------------------------------------ inspect

def test_inspect_json(tmp_path) -> None:
    out = tmp_path / "cm.xge"
    xg.compile_file(EXAMPLES / "cluster_matmul.xg", target="gb200").save(out)
    res = cli("xgbuild", "inspect", out, "--json")
    assert res.code == 0, res.both
    info = json.loads(res.out)
    assert info["format_version"] == 1
    assert info["target"] == "GB200" and info["num_gpu"] == 2
    assert info["entry"]["inputs"] == [{"name": "A", "dtype": "float32", "shape": ["M", "K"]},
                                       {"name": "B", "dtype": "float32", "shape": ["K", "N"]}]
    assert info["entry"]["output"] == {"tensor": {"dtype": "float32", "shape": ["M", "N"]}}
    assert isinstance(info["kernels"], list)
    assert {"xg", "triton"} <= set(info["toolchain"])
    src_digest = hashlib.sha256((EXAMPLES / "cluster_matmul.xg").read_bytes()).hexdigest()
    assert info["sources"] == [{"path": "sources/cluster_matmul.xg", "sha256": src_digest}]
    assert info["digest"] == xg.load_engine(out).digest


def test_inspect_num_gpu_override(tmp_path) -> None:
    out = tmp_path / "sd.xge"
    xg.compile_file(EXAMPLES / "safe_div.xg", target="h100", num_gpu=4).save(out)
    info = json.loads(cli("xgbuild", "inspect", out, "--json").out)
    assert (info["target"], info["num_gpu"]) == ("H100", 4)
    assert info["entry"]["inputs"] == []


def test_inspect_human(example_files) -> None:
    res = cli("xgbuild", "inspect", example_files["attention"])
    assert res.code == 0, res.both
    for needle in ("format", "target      H100", "Q ", "bfloat16", "kernels", "sources/attention.xg"):
        assert needle in res.out, needle


def test_inspect_lists_outputs_not_a_dict(tmp_path) -> None:
    body = ", ".join(f"X * {i}.0" for i in range(20))
    path = write_program(tmp_path, src_text(f"""
        extern Tensor[float32, N] X
        def main() {{
            return {body}
        }}
    """))
    xg.compile_file(path, kernels=False).save(tmp_path / "many.xge")
    res = cli("xgbuild", "inspect", tmp_path / "many.xge")
    assert res.code == 0, res.both
    assert "{" not in res.out and "'tensor'" not in res.out, res.out
    assert "outputs     20\n" in res.out
    assert re.search(r"^  out_0 +float32 +\['N'\]$", res.out, re.M), res.out
    assert "8 more (--json lists them all)" in res.out
    assert max(len(line) for line in res.out.splitlines()) < 160


def test_inspect_refuses_a_damaged_engine(tmp_path, engine_bytes) -> None:
    path = tmp_path / "bad.xge"
    path.write_bytes(engine_bytes[:-3])
    assert_clean_failure(cli("xgbuild", "inspect", path), str(path))


def test_inspect_shows_each_kernels_full_key(example_files) -> None:
    """The key on a kernel row is the whole 64-hex key, so it can be pasted into `cache explain`
    (issue 25: it was a 12-character prefix that `cache explain` refused)."""
    manifest = json.loads(cli("xgbuild", "inspect", example_files["attention"], "--json").out)
    keys = [k["tuning"]["key"] for k in manifest["kernels"]]
    res = cli("xgbuild", "inspect", example_files["attention"])
    assert keys and res.code == 0, res.both
    for key in keys:
        assert len(key) == 64 and f"key {key}\n" in res.out, key
