"""Attacks on the shared remote cache: self-consistent forged records on a real nginx server.

A record proves only that its key parts hash to its key; anyone who can PUT to the server can
write one with any value and any blobs. Here an attacker does exactly that after an honest build
(checkout A) filled the server: forged cubin records naming the attacker's bytes, and forged
winners naming configs outside the job's search space. Another checkout (B, its own empty local
cache) then builds the same program through the same server. Its engine must carry the bytes it
compiled itself, the build must succeed, and its warnings must name each poisoned key.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from xgbuild.cache import BlobRef, Cache, LocalStore, Record, RemoteStore
from xgbuild.cache.records import decode_record
from xgbuild.packager.engine_file import read_engine

ROOT = Path(__file__).resolve().parents[3]
CACHE_SERVER = ROOT / "tools" / "cache-server"
NGINX = Path("/usr/sbin/nginx")
BIN = Path(sys.executable).parent
PROGRAM = """extern Tensor[float32, T, D] X
def main() {
    return relu(X * 2.0 + 1.0)
}
"""
EVIL = b"\x7fELF" + b"attacker-controlled cubin " * 200


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[str]:
    if not NGINX.exists():
        pytest.skip(f"{NGINX} is not installed (apt-get install nginx)")
    root = tmp_path / "nginx"
    proc = subprocess.run([sys.executable, str(CACHE_SERVER), "start", "--dir", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    try:
        yield proc.stdout.strip()
    finally:
        subprocess.run([sys.executable, str(CACHE_SERVER), "stop", "--dir", str(root)], capture_output=True,
                       timeout=60)


def build(tmp_path: Path, checkout: str, url: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`xgc` in a checkout of its own (its own local cache) with the shared remote configured."""
    src = tmp_path / "k.xg"
    src.write_text(PROGRAM)
    out = tmp_path / f"{checkout}.xge"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XG_")}
    env.update(XG_CACHE_DIR=str(tmp_path / f"cache-{checkout}"), XG_REMOTE_CACHE=url, PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(BIN / "xgc"), str(src), "--target", "H100", "--dim", "T=16", "--dim", "D=32",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc, out


def kernel_files(path: Path) -> dict[str, bytes]:
    return {k: v for k, v in read_engine(path).entries.items() if k.startswith("kernels/")}


def server_records(url: str, tmp_path: Path) -> list[Record]:
    data = tmp_path / "nginx" / "data" / "ac"
    return [decode_record((data / key).read_bytes(), key) for key in sorted(os.listdir(data))]


def put_forged(url: str, record: Record, blobs: dict[str, bytes]) -> None:
    """What the attacker uploads: raw blobs, then a record that passes every self-check."""
    remote = RemoteStore(url)
    for data in blobs.values():
        remote.put("cas", hashlib.sha256(data).hexdigest(), data)
    remote.put("ac", record.digest, record.encode())
    remote.close()


@pytest.mark.timeout(600)
def test_a_forged_cubin_record_never_reaches_another_checkouts_engine(nginx: str, tmp_path: Path) -> None:
    _, honest = build(tmp_path, "a", nginx)
    forged = []
    for record in server_records(nginx, tmp_path):
        if record.key.kind != "cubin":
            continue
        ref = BlobRef(hashlib.sha256(EVIL).hexdigest(), len(EVIL))
        fake = Record(record.key, record.value, {"cubin": ref, "ptx": record.blobs["ptx"]})
        decode_record(fake.encode(), fake.digest)               # self-consistent: passes every check
        put_forged(nginx, fake, {"cubin": EVIL})
        forged.append(record.digest)
    assert len(forged) == 2                                      # the tuned and the generic variant

    proc, other = build(tmp_path, "b", nginx)
    got, want = kernel_files(other), kernel_files(honest)
    assert got == want and not any(EVIL in v for v in got.values())
    assert other.read_bytes() == honest.read_bytes()            # the same engine, byte for byte
    for key in forged:
        assert key in proc.stderr and "poisoned" in proc.stderr, proc.stderr
    assert "cubin differs" in proc.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith("XG_")}
    env.update(XG_CACHE_DIR=str(tmp_path / "cache-b"), PYTHONPATH=str(ROOT))
    shown = subprocess.run([str(BIN / "xgbuild"), "cache", "explain", forged[0], "--json"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    explained = json.loads(shown.stdout)
    assert explained["origin"] == "re-derived" and explained["blobs"]["cubin"]["digest"] != ref.digest
    with Cache(LocalStore(tmp_path / "cache-b")) as local:
        hit = local.lookup(forged[0])
        assert hit is not None and EVIL not in hit.blobs["cubin"]


@pytest.mark.timeout(600)
def test_a_forged_winner_outside_the_search_space_is_rejected(nginx: str, tmp_path: Path) -> None:
    _, honest = build(tmp_path, "a", nginx)
    tuning = read_engine(honest).manifest["kernels"][0]["tuning"]
    with Cache(LocalStore(tmp_path / "cache-a")) as a:
        predicted = a.local.get_record(tuning["key"])            # its key parts, as any host can compute
    evil = {"BLOCK": 1 << 20, "num_stages": 1, "num_warps": 64}
    fake = Record(predicted.key, {"how": "measured", "config": evil, "ms": 0.0001, "measured_on": "H100",
                                  "candidates": 6}, {})
    put_forged(nginx, fake, {})

    proc, other = build(tmp_path, "b", nginx)
    got = read_engine(other).manifest["kernels"][0]
    assert got["tuning"]["config"] == tuning["config"] and got["tuning"]["source"] == "predicted"
    assert all(v["config"] != evil for v in got["variants"])
    assert tuning["key"] in proc.stderr and "not a candidate" in proc.stderr, proc.stderr


@pytest.mark.timeout(600)
def test_a_forged_winner_inside_the_search_space_can_only_choose_among_candidates(
        nginx: str, tmp_path: Path) -> None:
    """Timings from the remote are not re-measured: a lie picks another of the job's own
    candidates (a slower build at worst), compiled here from XG's own kernel source."""
    _, honest = build(tmp_path, "a", nginx)
    tuning = read_engine(honest).manifest["kernels"][0]["tuning"]
    with Cache(LocalStore(tmp_path / "cache-a")) as a:
        predicted = a.local.get_record(tuning["key"])
    space = [json.loads(c) for c in predicted.key.parts()["search_space"]["configs"]]
    other_cfg = next(c for c in space if c != tuning["config"])
    fake = Record(predicted.key, {"how": "measured", "config": other_cfg, "ms": 0.0001, "measured_on": "H100",
                                  "candidates": 6}, {})
    put_forged(nginx, fake, {})
    proc, other = build(tmp_path, "b", nginx)
    got = read_engine(other).manifest["kernels"][0]
    assert got["tuning"]["config"] == other_cfg and got["tuning"]["source"] == "cache"
    with Cache(LocalStore(tmp_path / "cache-b")) as b:
        hit = b.lookup(tuning["key"])
        assert hit is not None and hit.origin == "remote-verified"
