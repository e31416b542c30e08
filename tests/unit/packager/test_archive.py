"""Tests for `xgbuild.packager.archive`: round trip, determinism, layout, the writer's checks.

The refusals of damaged and hostile files are in `test_archive_refusals.py`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from xgbuild.packager import frame, ustar
from xgbuild.packager.archive import (
    INDEX_NAME, Bundle, BundleEntryError, bundle_digest_of, read_bundle, write_bundle,
)
from xgbuild.packager.digest import index_bytes, name_conflict, name_problem
from xgbuild.settings import REPO_ROOT


def sample_entries() -> dict[str, bytes]:
    rng = random.Random(7)
    return {
        "manifest.json": b'{"format":1,"target":"H100"}\n',
        "ir/program.json": json.dumps({"ops": list(range(50))}).encode(),
        "kernels/sm_90/k0.cubin": rng.randbytes(3000),
        "kernels/sm_90/k1.cubin": bytes(512),
        "sources/models/train.xg": b"fn main() {}\n",
        "empty": b"",
    }


def decompressed(path: Path) -> bytes:
    return zstandard.ZstdDecompressor().decompress(path.read_bytes())


# --- round trip ----------------------------------------------------------------------------------


def test_round_trip_gives_back_the_entries_and_the_digest(tmp_path):
    entries = sample_entries()
    digest = write_bundle(tmp_path / "e.xge", entries)
    bundle = read_bundle(tmp_path / "e.xge")
    assert bundle.digest == digest == bundle_digest_of(entries)
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    assert dict(bundle.entries) == entries
    assert bundle.names() == tuple(sorted(entries))
    assert INDEX_NAME not in bundle.entries


def test_bundle_is_a_read_only_value(tmp_path):
    write_bundle(tmp_path / "e.xge", sample_entries())
    bundle = read_bundle(str(tmp_path / "e.xge"))          # a str path works too
    with pytest.raises(TypeError):
        bundle.entries["manifest.json"] = b"{}"             # type: ignore[index]
    with pytest.raises(AttributeError):
        bundle.digest = "0" * 64                            # type: ignore[misc]
    source = {"b": b"2", "a": b"1"}
    made = Bundle("d" * 64, source)
    source["c"] = b"3"
    assert made.names() == ("a", "b")                       # a private copy, in name order
    assert made == Bundle("d" * 64, {}) and hash(made) == hash(Bundle("d" * 64, {}))


@pytest.mark.parametrize("entries", [
    {},
    {"a": b""},
    {"exactly-one-block": bytes(range(256)) * 2},
    {"x" * 90 + "/" + "y" * 100: b"long name, split into prefix and name"},
    {"a/" * 50 + "z": b"deep"},
    {"AZaz09._-/leaf": b"every allowed character"},
])
def test_round_trip_edge_cases(tmp_path, entries):
    digest = write_bundle(tmp_path / "e.xge", entries)
    bundle = read_bundle(tmp_path / "e.xge")
    assert (bundle.digest, dict(bundle.entries)) == (digest, entries)


def test_a_bundle_over_8_mib_round_trips(tmp_path):
    # Over 8 MiB a level-9 frame is no longer single-segment: it declares a window.
    entries = {"big.bin": bytes(9 << 20), "tail.bin": random.Random(1).randbytes(1000)}
    digest = write_bundle(tmp_path / "big.xge", entries)
    params = zstandard.get_frame_parameters((tmp_path / "big.xge").read_bytes())
    assert params.window_size > 0 and params.has_checksum and params.content_size > 9 << 20
    bundle = read_bundle(tmp_path / "big.xge")
    assert bundle.digest == digest and bundle.entries == entries


def test_writing_replaces_an_existing_bundle_and_leaves_no_temp_file(tmp_path):
    write_bundle(tmp_path / "e.xge", {"a": b"old"})
    write_bundle(tmp_path / "e.xge", {"a": b"new"})
    assert read_bundle(tmp_path / "e.xge").entries == {"a": b"new"}
    assert os.listdir(tmp_path) == ["e.xge"]
    assert (tmp_path / "e.xge").stat().st_mode & 0o777 == 0o644 & ~current_umask()


def current_umask() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def test_a_failed_write_leaves_no_temp_file(tmp_path):
    (tmp_path / "e.xge").mkdir()                            # os.replace cannot replace a directory
    with pytest.raises(OSError):
        write_bundle(tmp_path / "e.xge", {"a": b"1"})
    assert os.listdir(tmp_path) == ["e.xge"]
    with pytest.raises(FileNotFoundError):
        write_bundle(tmp_path / "missing" / "e.xge", {"a": b"1"})


# --- determinism ---------------------------------------------------------------------------------

CHILD = r"""
import json, os, sys, time
from pathlib import Path
os.umask(0o077)
time.time = lambda: 4102444800.0            # 2100-01-01: the clock must not reach the bytes
time.time_ns = lambda: 4102444800 * 10**9
from xgbuild.packager.archive import write_bundle
items = json.loads(sys.stdin.read())
entries = {name: bytes.fromhex(data) for name, data in reversed(items)}
print(write_bundle(Path(sys.argv[1]), entries))
print(oct(os.stat(sys.argv[1]).st_mode & 0o777))
"""


def test_same_entries_same_bytes_in_another_process_directory_and_environment(tmp_path):
    entries = sample_entries()
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "deeper").mkdir(parents=True)
    here = write_bundle(tmp_path / "a" / "engine.xge", entries)
    env = dict(os.environ, TZ="Pacific/Chatham", PYTHONHASHSEED="4242", LC_ALL="C", LANG="C",
               HOME=str(tmp_path), USER="someone-else", PYTHONPATH=str(REPO_ROOT))
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "b" / "deeper" / "other-name.xge")],
        input=json.dumps([[name, data.hex()] for name, data in entries.items()]),
        env=env, cwd=tmp_path / "b", capture_output=True, text=True, timeout=60, check=True)
    there, mode = child.stdout.split()
    assert there == here
    assert mode == "0o600"                                  # the umask applies to the file mode only
    assert (tmp_path / "a" / "engine.xge").read_bytes() == \
        (tmp_path / "b" / "deeper" / "other-name.xge").read_bytes()


def test_insertion_order_does_not_change_the_bytes(tmp_path):
    entries = sample_entries()
    shuffled = list(entries.items())
    random.Random(3).shuffle(shuffled)
    one = write_bundle(tmp_path / "one.xge", entries)
    two = write_bundle(tmp_path / "two.xge", dict(reversed(shuffled)))
    assert one == two == bundle_digest_of(dict(shuffled))
    assert (tmp_path / "one.xge").read_bytes() == (tmp_path / "two.xge").read_bytes()


def test_the_digest_tracks_names_and_contents():
    base = sample_entries()
    digests = {bundle_digest_of(base)}
    digests.add(bundle_digest_of({**base, "manifest.json": base["manifest.json"] + b" "}))
    digests.add(bundle_digest_of({**base, "extra": b""}))
    renamed = dict(base)
    renamed["empty2"] = renamed.pop("empty")
    digests.add(bundle_digest_of(renamed))
    assert len(digests) == 4


def test_golden_bytes_pin_the_format(tmp_path):
    # If one of these changes, every engine ever built changes digest: bump the index format instead.
    entries = {"manifest.json": b"{}\n", "kernels/k0.cubin": b"\x7fELF"}
    assert index_bytes(entries) == (
        b'{"entries":{"kernels/k0.cubin":{"sha256":"'
        + hashlib.sha256(b"\x7fELF").hexdigest().encode()
        + b'","size":4},"manifest.json":{"sha256":"'
        + hashlib.sha256(b"{}\n").hexdigest().encode()
        + b'","size":3}},"format":1}\n')
    assert bundle_digest_of(entries) == hashlib.sha256(index_bytes(entries)).hexdigest()
    assert bundle_digest_of(entries) == GOLDEN_DIGEST
    write_bundle(tmp_path / "g.xge", entries)
    assert hashlib.sha256(decompressed(tmp_path / "g.xge")).hexdigest() == GOLDEN_TAR_SHA256
    # The compressed bytes are also a function of the zstd library: pinned per version, so that an
    # upgrade that changes them is noticed (engines keep their digests; their files change).
    if zstandard.ZSTD_VERSION in GOLDEN_FILE_SHA256:
        file_sha256 = hashlib.sha256((tmp_path / "g.xge").read_bytes()).hexdigest()
        assert file_sha256 == GOLDEN_FILE_SHA256[zstandard.ZSTD_VERSION]


GOLDEN_DIGEST = "f97d229670b926de641b827ae4ac39bfbc741d08023fca2f077bcf1bf1b30c62"
GOLDEN_TAR_SHA256 = "69ae9b7d353a9585bf8e1748d5859b17aec42cae0fabc11cd8142a2bd7399312"
GOLDEN_FILE_SHA256 = {(1, 5, 7): "e4c702416f393fe8e6c83bd060eca08099eaf8c205400230f815a167075afb11"}   # level 9


def test_the_digest_does_not_depend_on_compression(tmp_path):
    entries = sample_entries()
    digest = write_bundle(tmp_path / "e.xge", entries)
    stream = decompressed(tmp_path / "e.xge")
    fast = zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=True)
    compressed = fast.compress(stream)
    (tmp_path / "fast.xge").write_bytes(compressed + frame.seal(compressed, digest))
    assert (tmp_path / "fast.xge").read_bytes() != (tmp_path / "e.xge").read_bytes()
    assert read_bundle(tmp_path / "fast.xge").digest == digest


@pytest.mark.skipif(shutil.which("zstd") is None or shutil.which("tar") is None,
                    reason="needs the zstd and tar command-line tools")
def test_standard_tools_read_a_bundle(tmp_path):
    entries = sample_entries()
    write_bundle(tmp_path / "e.xge", entries)
    # The seal is a skippable frame: the zstd tool passes over it.
    stream = subprocess.run(["zstd", "-dc", str(tmp_path / "e.xge")], capture_output=True,
                            check=True, timeout=60).stdout
    assert stream == decompressed(tmp_path / "e.xge")
    listing = subprocess.run(["tar", "-tf", "-"], input=stream, capture_output=True, check=True,
                             timeout=60).stdout.decode().split()
    assert listing == [INDEX_NAME, *sorted(entries)]


# --- layout --------------------------------------------------------------------------------------


def test_layout_index_first_then_sorted_entries_with_fixed_headers(tmp_path):
    entries = sample_entries()
    digest = write_bundle(tmp_path / "e.xge", entries)
    data = (tmp_path / "e.xge").read_bytes()
    params = zstandard.get_frame_parameters(data)
    stream = decompressed(tmp_path / "e.xge")
    assert params.has_checksum and params.content_size == len(stream) and params.dict_id == 0
    compressed, seal = data[:-frame.SEAL_SIZE], data[-frame.SEAL_SIZE:]
    assert seal[:8] == bytes.fromhex("5e2a4d18") + (68).to_bytes(4, "little")
    assert seal[8:] == b"XGE\x01" + hashlib.sha256(compressed).digest() + bytes.fromhex(digest)
    assert len(stream) % ustar.RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:   # stdlib tar reads it
        members = tar.getmembers()
        assert [m.name for m in members] == [INDEX_NAME, *sorted(entries)]
        for member in members:
            assert member.isreg() and not member.pax_headers
            assert (member.mode, member.uid, member.gid, member.mtime) == (0o644, 0, 0, 0)
            assert (member.uname, member.gname, member.linkname) == ("", "", "")
        index = json.loads(tar.extractfile(INDEX_NAME).read())
        for name, data in entries.items():
            assert tar.extractfile(name).read() == data
    assert index == {"format": 1, "entries": {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in entries.items()}}


def test_header_is_the_pinned_ustar_block():
    block = ustar.header("manifest.json", 7)
    assert len(block) == 512
    assert block[:100] == b"manifest.json" + bytes(87)
    assert block[100:148] == b"0000644\0" + b"0000000\0" * 2 + b"00000000007\0" + b"00000000000\0"
    assert block[148:156] == b"%06o\0 " % (sum(block) - sum(block[148:156]) + 8 * ord(" "))
    assert block[156:157] == b"0" and block[257:265] == b"ustar\x0000"
    assert block[157:257] == bytes(100) and block[265:512] == bytes(247)
    split = ustar.header("a" * 40 + "/" + "b" * 80, 0)
    assert split[:100] == b"b" * 80 + bytes(20) and split[345:386] == b"a" * 40 + bytes(1)


# --- the writer's checks -------------------------------------------------------------------------

BAD_NAMES = [
    "", "/abs", "../x", "a/../b", "./a", "a/.", "a//b", "a/", "a\\b", "a\x00b", "a b", "é",
    "a:b", "a*b", "x" * 256, "x" * 101, "x" * 160 + "/y", INDEX_NAME, 5, None,
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_writer_refuses_a_bad_name_and_writes_nothing(tmp_path, name):
    with pytest.raises(BundleEntryError) as caught:
        write_bundle(tmp_path / "e.xge", {name: b"data", "ok": b""})
    message = str(caught.value)
    assert message.startswith(f"cannot write engine {tmp_path / 'e.xge'}: entry name ")
    assert "is not allowed (" in message and "\n" not in message
    assert isinstance(caught.value, ValueError)
    assert os.listdir(tmp_path) == []
    with pytest.raises(BundleEntryError):
        bundle_digest_of({name: b"data"})


@pytest.mark.parametrize("value", ["text", bytearray(b"x"), memoryview(bytearray(b"x")), None, 3])
def test_writer_refuses_values_that_are_not_bytes(tmp_path, value):
    with pytest.raises(BundleEntryError, match=r"entry 'k' must be bytes, not "):
        write_bundle(tmp_path / "e.xge", {"k": value})
    assert os.listdir(tmp_path) == []


def test_writer_refuses_a_name_that_is_also_a_directory_and_a_non_mapping(tmp_path):
    with pytest.raises(BundleEntryError, match=r"entry 'a' cannot also be a directory \(of 'a/b'\)"):
        write_bundle(tmp_path / "e.xge", {"a/b": b"", "a": b""})
    with pytest.raises(BundleEntryError, match="cannot also be a directory"):
        bundle_digest_of({"DIGESTS.json/x": b""})
    with pytest.raises(BundleEntryError, match="entries must be a mapping"):
        write_bundle(tmp_path / "e.xge", [("a", b"")])     # type: ignore[arg-type]


def test_writer_enforces_the_caps_the_reader_will_apply(tmp_path):
    with pytest.raises(BundleEntryError, match=r"entry 'big' is 2000 bytes, over the cap of 1000"):
        write_bundle(tmp_path / "e.xge", {"big": bytes(2000)}, max_entry_size=1000)
    with pytest.raises(BundleEntryError, match="would be 10240 bytes uncompressed, over the cap"):
        write_bundle(tmp_path / "e.xge", {"a": b"x"}, max_total_size=10000)
    assert os.listdir(tmp_path) == []
    digest = write_bundle(tmp_path / "e.xge", {"a": bytes(1000)}, max_entry_size=1000)
    assert read_bundle(tmp_path / "e.xge", max_entry_size=1000).digest == digest


def test_name_rules_directly():
    assert name_problem("kernels/sm_90/k0.cubin") is None
    assert name_problem("../x") == "a '..' path component"
    assert name_problem("/etc/passwd") == "an absolute path"
    assert name_problem("a\\b") == "character '\\\\' is not in [A-Za-z0-9._/-]"
    assert name_conflict(["a", "ab/c", "a.b"]) is None
    assert name_conflict(["x/y/z", "x/y"]) == ("x/y", "x/y/z")

