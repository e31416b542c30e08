"""Provenance and rebuild verification: what a signed engine says of its build is checked against
the engine, and `xgbuild verify --rebuild` reproduces an engine byte for byte from what it
carries, or says which entries differ (a tampered source, a forged kernel table).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xgbuild.packager.archive import read_bundle, write_bundle
from xgbuild.packager.manifest import canonical_json, sha256
from xgbuild.packager.provenance import CUBIN_ORIGINS, PREDICATE_TYPE, WINNER_ORIGINS

REPO = Path(__file__).resolve().parents[3]
SOURCE = """extern Tensor[float32, 8, 16] A
extern Tensor[float32, 16, 8] B
def main() -> Tensor[float32, 8, 8] {
    return relu(A @ B) * 0.5
}
"""


def cli(tool: str, *args: str, cwd: Path | None = None, env: dict | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k != "XG_TRUSTED_KEYS"}
    return subprocess.run([sys.executable, "-m", f"xgbuild.cli.{tool}", *args], cwd=cwd,
                          env={**inherited, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def statement_of(path: Path) -> dict:
    envelope = json.loads(read_bundle(path).trailer)
    return json.loads(base64.b64decode(envelope["payload"]))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("prov")
    (root / "k.xg").write_text(SOURCE)
    env = {"XG_CACHE_DIR": str(root / "cache"), "XG_BUILDER_ID": "https://ci.example/b1"}
    assert cli("xgbuild", "keygen", "--out", "key", cwd=root, env=env).returncode == 0
    for out in ("first.xge", "second.xge"):      # the second build finds the first's records in the cache
        res = cli("xgc", "k.xg", "--out", out, "--sign-key", "key", "--quiet", "--jobs", "1", cwd=root, env=env)
        assert res.returncode == 0, res.stderr
    return root


@pytest.mark.timeout(300)
def test_the_statement_describes_this_engine(built):
    bundle = read_bundle(built / "first.xge")
    manifest = json.loads(bundle.entries["manifest.json"])
    st = statement_of(built / "first.xge")
    assert st["_type"] == "https://in-toto.io/Statement/v1" and st["predicateType"] == PREDICATE_TYPE
    assert st["subject"] == [{"name": "first.xge", "digest": {"sha256": bundle.digest}}]
    build = st["predicate"]["buildDefinition"]
    assert build["externalParameters"]["target"] == manifest["target"]
    assert st["predicate"]["runDetails"]["builder"]["id"] == "https://ci.example/b1"
    assert build["internalParameters"]["toolchain"]["xg"] == manifest["toolchain"]["xg"]
    deps = build["resolvedDependencies"]
    sources = {d["name"]: d["digest"]["sha256"] for d in deps if d["name"].startswith("sources/")}
    assert sources == {"sources/k.xg": hashlib.sha256(SOURCE.encode()).hexdigest()}
    assert sources["sources/k.xg"] == sha256(bundle.entries["sources/k.xg"])
    winners = [d for d in deps if d["name"].startswith("xg-cache:winner/")]
    cubins = [d for d in deps if d["name"].startswith("xg-cache:cubin/")]
    assert len(winners) == len(manifest["kernels"]) >= 1
    assert {d["digest"]["sha256"] for d in winners} == {k["tuning"]["key"] for k in manifest["kernels"]}
    assert {d["digest"]["sha256"] for d in cubins} == {v["cubin_sha256"] for k in manifest["kernels"]
                                                       for v in k["variants"]}
    assert all(d["annotations"]["origin"] in WINNER_ORIGINS for d in winners)
    assert all(d["annotations"]["origin"] in CUBIN_ORIGINS for d in cubins)
    # A first build in an empty cache compiled its kernels; the second took them from the local cache.
    assert {d["annotations"]["origin"] for d in cubins} == {"compiled"}
    second = statement_of(built / "second.xge")["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert {d["annotations"]["origin"] for d in second if d["name"].startswith("xg-cache:cubin/")} == {"local-cache"}
    # Same sources and winners: the same bundle, whatever the provenance says.
    assert read_bundle(built / "second.xge").digest == bundle.digest


@pytest.mark.timeout(300)
def test_verify_rebuild_reproduces_an_xgc_engine_of_the_training_step(tmp_path):
    env = {"XG_CACHE_DIR": str(tmp_path / "cache")}
    engine = tmp_path / "train.xge"
    res = cli("xgc", str(REPO / "models" / "train_tiny.xg"), "--out", str(engine), "--quiet", "--jobs", "2", env=env)
    assert res.returncode == 0, res.stderr
    res = cli("xgbuild", "verify", "--rebuild", str(engine), "--jobs", "2", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert "the same bytes" in res.stdout


@pytest.mark.timeout(300)
def test_verify_rebuild_names_what_a_tampered_engine_changed(built, tmp_path):
    bundle = read_bundle(built / "first.xge")
    entries = dict(bundle.entries)
    # The attacker's source says `* 2.0`; the program still computes `* 0.5` (or the reverse): the
    # manifest's digests are made to match and the bundle re-sealed by XG's own writer.
    entries["sources/k.xg"] = SOURCE.replace("0.5", "2.0").encode()
    manifest = json.loads(entries["manifest.json"])
    manifest["sources"][0]["sha256"] = sha256(entries["sources/k.xg"])
    entries["manifest.json"] = canonical_json(manifest)
    forged = tmp_path / "forged.xge"
    write_bundle(forged, entries)
    res = cli("xgbuild", "verify", "--rebuild", str(forged), "--jobs", "1", env={"XG_CACHE_DIR": str(tmp_path / "c")})
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    # The constant is inside the kernel: the sources give another kernel job than the one linked.
    assert "does not rebuild" in res.stderr and "kernel" in res.stderr
    # The same source edit in a CPU-only engine: the program entry differs.
    (tmp_path / "k.xg").write_text(SOURCE)
    cpu = tmp_path / "cpu.xge"
    assert cli("xgc", str(tmp_path / "k.xg"), "--out", str(cpu), "--no-kernels", "--quiet").returncode == 0
    entries = dict(read_bundle(cpu).entries)
    entries["sources/k.xg"] = SOURCE.replace("0.5", "2.0").encode()
    manifest = json.loads(entries["manifest.json"])
    manifest["sources"][0]["sha256"] = sha256(entries["sources/k.xg"])
    entries["manifest.json"] = canonical_json(manifest)
    write_bundle(forged, entries)
    res = cli("xgbuild", "verify", "--rebuild", str(forged))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "does not rebuild to the same bytes" in res.stderr and "program.json" in res.stderr
    # A kernel's recorded winner swapped for another config: the cubins rebuilt from it differ.
    entries = dict(bundle.entries)
    manifest = json.loads(entries["manifest.json"])
    cubin = manifest["kernels"][0]["variants"][0]["cubin"]
    entries[cubin] = entries[cubin][:-1] + bytes([entries[cubin][-1] ^ 1])
    manifest["kernels"][0]["variants"][0]["cubin_sha256"] = sha256(entries[cubin])
    entries["manifest.json"] = canonical_json(manifest)
    write_bundle(forged, entries)
    res = cli("xgbuild", "verify", "--rebuild", str(forged), "--jobs", "1", env={"XG_CACHE_DIR": str(tmp_path / "c")})
    assert res.returncode == 1 and cubin in res.stderr, res.stderr


@pytest.mark.timeout(300)
def test_an_imported_model_cannot_be_rebuilt_and_says_so(tmp_path):
    import torch

    import xg
    engine = xg.compile(torch.nn.Linear(4, 3), (torch.randn(2, 4),), kernels=False)
    engine.save(tmp_path / "model.xge")
    res = cli("xgbuild", "verify", "--rebuild", str(tmp_path / "model.xge"))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "imported model" in res.stderr and "cannot be rebuilt" in res.stderr


@pytest.mark.slow
@pytest.mark.bazel
@pytest.mark.timeout(1800)
def test_verify_rebuild_reproduces_the_bazel_train_engine():
    """`bazel build //models:train_engine_small` (jobs, tune-shard and link actions; the training
    step of models/train.xg with `consts` overriding its sizes), then a rebuild from the engine
    alone gives the same bytes: the engine records the overrides it was built with."""
    sys.path.insert(0, str(REPO / "tests" / "bazel"))
    from bazel_helpers import REPO as BAZEL_REPO, Workspace, explain
    ws = Workspace(BAZEL_REPO)
    try:
        res = ws.build("//models:train_engine_small")
        assert res.returncode == 0, explain(res)
        engine = ws.bin("models/train_engine_small.xge")
        res = cli("xgbuild", "verify", "--rebuild", str(engine), timeout=900)
        assert res.returncode == 0, res.stderr
        assert "the same bytes" in res.stdout
    finally:
        ws.shutdown()
