"""Tests that `read_bundle` refuses damaged and hostile files, always with a one-line `BundleError`.

Flipped bytes, truncations, hand-made tars (links, devices, `..`, absolute paths, duplicates,
entries missing from the index), decompression bombs, random bytes and files that are not engines.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import tarfile
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from xgbuild.packager import frame, ustar
from xgbuild.packager.archive import (
    INDEX_NAME, BundleCorruptError, BundleError, BundleFormatError, BundleReadError,
    BundleTooLargeError, read_bundle, write_bundle,
)
from xgbuild.packager.digest import digest_of_index, index_bytes

A, B = b"alpha contents\n", b"beta contents\n"


def sealed(compressed: bytes, digest: str = "0" * 64) -> bytes:
    return compressed + frame.seal(compressed, digest)


def forged(stream: bytes, digest: str = "0" * 64) -> bytes:
    """`stream` compressed and sealed the way a careful forger would, so that only its tar is wrong."""
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
    return sealed(compressor.compress(stream), digest)


def refused(path: Path, kind: type[BundleError] = BundleError, match: str = "", **caps) -> str:
    with pytest.raises(BundleError) as caught:
        read_bundle(path, **caps)
    message = str(caught.value)
    assert isinstance(caught.value, kind), message
    assert message.startswith(f"engine {path}") and "\n" not in message
    assert match in message, message
    return message


def engine_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "crafted.xge"
    path.write_bytes(data)
    return path


def small_bundle(tmp_path: Path) -> bytes:
    write_bundle(tmp_path / "good.xge", {"manifest.json": b'{"format":1}', "kernels/k0.cubin": A})
    return (tmp_path / "good.xge").read_bytes()


def medium_bundle(tmp_path: Path) -> bytes:
    # Text-like entries big enough for several zstd blocks with Huffman and FSE tables.
    rng = random.Random(11)
    words = [rng.randbytes(rng.randint(2, 9)).hex().encode() for _ in range(400)]
    entries = {f"sources/f{i}.xg": b" ".join(rng.choice(words) for _ in range(9000)) for i in range(4)}
    write_bundle(tmp_path / "medium.xge", entries)
    return (tmp_path / "medium.xge").read_bytes()


def first_wrong(path: Path, good: bytes, changes) -> list[str]:
    """Write each changed copy of `good` and read it; describe every one that was not refused."""
    wrong = []
    for label, data in changes:
        path.write_bytes(data)
        try:
            read_bundle(path)
        except BundleError as err:
            assert "\n" not in str(err)
        except Exception as err:                        # noqa: BLE001 -- the point of the test
            wrong.append(f"{label}: raised {err!r}")
        else:
            wrong.append(f"{label}: accepted")
    return wrong


def flips(good: bytes, positions, masks):
    for position in positions:
        for mask in masks:
            data = bytearray(good)
            data[position] ^= mask
            yield f"byte {position} ^ {mask:#04x}", bytes(data)


# --- damage --------------------------------------------------------------------------------------


def test_every_byte_flip_of_a_small_bundle_is_refused(tmp_path):
    good = small_bundle(tmp_path)
    masks = (0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF)
    assert first_wrong(tmp_path / "bad.xge", good, flips(good, range(len(good)), masks)) == []


def test_behind_a_recomputed_seal_a_flip_is_refused_or_changes_nothing(tmp_path):
    # The layers under the seal on their own: zstd's checksum, the tar checks and the index. A flip
    # in bits no decoder reads decodes to the same entries; no flip may give other entries.
    good = small_bundle(tmp_path)
    expected = read_bundle(tmp_path / "good.xge")
    compressed = good[:-frame.SEAL_SIZE]
    path, unchanged = tmp_path / "resealed.xge", 0
    for label, data in flips(compressed, range(len(compressed)), (0x01, 0x10, 0x80, 0xFF)):
        path.write_bytes(sealed(data, expected.digest))
        try:
            bundle = read_bundle(path)
        except BundleError:
            continue
        assert (bundle.digest, bundle.entries) == (expected.digest, expected.entries), label
        unchanged += 1
    assert unchanged < len(compressed)                      # a few ignored bits, no more


def test_sampled_byte_flips_of_a_multi_block_bundle_are_refused(tmp_path):
    good = medium_bundle(tmp_path)
    rng = random.Random(5)
    positions = sorted({*range(16), *range(len(good) - 8, len(good)), *rng.sample(range(len(good)), 300)})
    changes = flips(good, positions, (0x01, 0x80))
    assert first_wrong(tmp_path / "bad.xge", good, changes) == []


def test_header_flips_of_a_windowed_bundle_are_refused(tmp_path):
    # Over 8 MiB the frame is not single-segment and declares a window: a larger window decodes the
    # same bytes, so only the reader's own check of the header can notice it.
    write_bundle(tmp_path / "big.xge", {"zeros.bin": bytes(9 << 20)})
    good = (tmp_path / "big.xge").read_bytes()
    masks = (0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80)
    assert first_wrong(tmp_path / "bad.xge", good, flips(good, range(10), masks)) == []


def test_truncation_at_every_length_is_refused(tmp_path):
    good = small_bundle(tmp_path)
    cuts = ((f"cut to {n}", good[:n]) for n in range(len(good)))
    assert first_wrong(tmp_path / "bad.xge", good, cuts) == []
    refused(engine_file(tmp_path, good[:-1]), BundleCorruptError, "does not end with XG's seal")
    refused(engine_file(tmp_path, good[:3]), BundleCorruptError, "is truncated (it ends inside the zstd magic")


def test_truncation_of_a_multi_block_bundle_is_refused(tmp_path):
    good = medium_bundle(tmp_path)
    cuts = ((f"cut to {n}", good[:n]) for n in random.Random(9).sample(range(len(good)), 200))
    assert first_wrong(tmp_path / "bad.xge", good, cuts) == []


def test_anything_after_the_seal_or_between_frame_and_seal_is_refused(tmp_path):
    good = small_bundle(tmp_path)
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"junk"
    refused(engine_file(tmp_path, good + b"\x00"), BundleCorruptError, "does not end with XG's seal")
    for tail in (good, skippable):
        refused(engine_file(tmp_path, good + tail), BundleCorruptError)
    compressed, digest = good[:-frame.SEAL_SIZE], read_bundle(tmp_path / "good.xge").digest
    for junk in (b"\x00", skippable, compressed):
        refused(engine_file(tmp_path, sealed(compressed + junk, digest)), BundleFormatError,
                "bytes follow the zstd frame")


def test_the_seal_must_match_the_frame_and_the_contents(tmp_path):
    good = small_bundle(tmp_path)
    compressed, seal = good[:-frame.SEAL_SIZE], good[-frame.SEAL_SIZE:]
    refused(engine_file(tmp_path, compressed + seal[:-1] + bytes([seal[-1] ^ 1])), BundleCorruptError,
            "its seal records digest")
    refused(engine_file(tmp_path, compressed + seal[:8] + b"XGE\x03" + seal[12:]), BundleFormatError,
            "its seal has tag b'XGE\\x03'; this XG reads b'XGE\\x01' and b'XGE\\x02'")
    refused(engine_file(tmp_path, compressed + seal[:8] + b"XGE\x02" + seal[12:]), BundleFormatError,
            "its seal says it holds stored entries, but none follow the zstd frame")
    other = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(b"x" * 100)
    refused(engine_file(tmp_path, other + seal), BundleCorruptError,
            "its compressed bytes do not match the sha256 recorded in its seal")


# --- not an engine -------------------------------------------------------------------------------


def test_an_empty_file_random_bytes_and_other_formats_are_not_engines(tmp_path):
    refused(engine_file(tmp_path, b""), BundleFormatError, "is not an XG engine (an empty file)")
    rng = random.Random(2)
    for size in (1, 7, 100, 4096, 70000):
        refused(engine_file(tmp_path, b"\x00" + rng.randbytes(size)), BundleFormatError,
                "is not an XG engine (not a zstd stream)")
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    refused(engine_file(tmp_path, plain.getvalue()), BundleFormatError,
            "is not an XG engine (an uncompressed tar, not a zstd stream)")
    refused(engine_file(tmp_path, gzip.compress(plain.getvalue(), mtime=0)), BundleFormatError,
            "not a zstd stream")
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"junk"
    refused(engine_file(tmp_path, skippable + forged(plain.getvalue())), BundleFormatError,
            "not a zstd stream")


def test_random_bytes_after_a_valid_frame_header_are_refused(tmp_path):
    rng = random.Random(4)
    for _ in range(50):
        data = b"\x28\xb5\x2f\xfd\x24\x0a" + rng.randbytes(rng.randint(0, 40))
        refused(engine_file(tmp_path, data), BundleCorruptError)
        refused(engine_file(tmp_path, sealed(data)))        # past the seal, zstd itself refuses


def test_a_zstd_frame_of_something_else_is_refused(tmp_path):
    refused(engine_file(tmp_path, forged(b"hello" * 300)), BundleFormatError,
            "the tar header at offset 0 is not a POSIX ustar header")
    stream = ustar.encode([(INDEX_NAME, index_bytes({"a": A})), ("a", A)])
    plain = zstandard.ZstdCompressor(write_checksum=False, write_content_size=True).compress(stream)
    refused(engine_file(tmp_path, sealed(plain)), BundleFormatError, "has no content checksum")
    streamed = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    unsized = streamed.compress(stream) + streamed.flush()
    refused(engine_file(tmp_path, sealed(unsized)), BundleFormatError, "does not declare its content size")
    digest = digest_of_index(index_bytes({"a": A}))
    assert read_bundle(engine_file(tmp_path, forged(stream, digest))).entries == {"a": A}


# --- hand-made tars ------------------------------------------------------------------------------


def regular(name: str, data: bytes, **fields) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def special(name: str, kind: bytes, **fields) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, 0o644, 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, None


def tar_of(*members, fmt: int = tarfile.USTAR_FORMAT, encoding: str = "ascii", prefix: bytes = b"") -> bytes:
    out = io.BytesIO()
    out.write(prefix)                                       # tarfile starts at the current offset
    with tarfile.open(fileobj=out, mode="w", format=fmt, encoding=encoding) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def indexed(*members, **kwargs) -> bytes:
    """A tar whose first member is a correct index of the regular members that follow."""
    listing = {info.name: data for info, data in members if data is not None}
    index = index_bytes(listing)
    prefix = ustar.header(INDEX_NAME, len(index)) + index + bytes(-len(index) % ustar.BLOCK)
    return tar_of(*members, prefix=prefix, **kwargs)


TARFILE_CASES = {
    "parent": (indexed(regular("../x", A)), "entry name '../x' is not allowed (a '..' path component)"),
    "escape": (indexed(regular("../../etc/passwd", A)), "entry name '../../etc/passwd' is not allowed"),
    "absolute": (indexed(regular("/etc/passwd", A)), "'/etc/passwd' is not allowed (an absolute path)"),
    "backslash": (indexed(regular("a\\b", A)), "is not in [A-Za-z0-9._/-]"),
    "dot": (indexed(regular("./a", A)), "is not allowed (a '.' path component)"),
    "non-ascii": (indexed(regular("caf\xe9", A), encoding="latin-1"), "(it holds a non-ASCII byte)"),
    "symlink": (indexed(special("link", tarfile.SYMTYPE, linkname="/etc/passwd")),
                "entry 'link' is a symbolic link; only regular files are allowed"),
    "hardlink": (indexed(regular("a", A), special("b", tarfile.LNKTYPE, linkname="a")),
                 "entry 'b' is a hard link"),
    "directory": (indexed(special("d", tarfile.DIRTYPE)), "entry 'd/' is a directory"),
    "fifo": (indexed(special("p", tarfile.FIFOTYPE)), "entry 'p' is a FIFO"),
    "device": (indexed(special("null", tarfile.CHRTYPE, devmajor=1, devminor=3)),
               "entry 'null' is a character device"),
    "pax": (indexed(regular("a", A, pax_headers={"comment": "hi"}), fmt=tarfile.PAX_FORMAT),
            "is a pax extended header"),
    "gnu-long-name": (indexed(regular("n" * 120, A), fmt=tarfile.GNU_FORMAT),
                      "is a GNU long-name record"),
    "duplicate": (indexed(regular("a", A), regular("a", A)), "entry 'a' appears twice"),
    "second-index": (indexed(regular(INDEX_NAME, A)), "entry 'DIGESTS.json' appears twice"),
    "mtime": (indexed(regular("a", A, mtime=1700000000)), "tar header XG does not write (field mtime)"),
    "owner": (indexed(regular("a", A, uname="root")), "(field uname)"),
    "mode": (indexed(regular("a", A, mode=0o755)), "(field mode)"),
    "setuid": (indexed(regular("a", A, mode=0o4644)), "(field mode)"),
    "uid": (indexed(regular("a", A, uid=1000)), "(field uid)"),
    "no-index": (tar_of(regular("a", A)), "its first entry is 'a', not the index DIGESTS.json"),
    "empty-tar": (tar_of(), "it holds no entries, not even the index"),
}


@pytest.mark.parametrize("case", sorted(TARFILE_CASES))
def test_hand_made_tars_are_refused(tmp_path, case):
    stream, message = TARFILE_CASES[case]
    refused(engine_file(tmp_path, forged(stream)), BundleError, message)


def canonical(*members: tuple[str, bytes], index: bytes | None = None, listed=None) -> bytes:
    """A canonical stream; the index lists `listed` (default: the members) unless `index` is given."""
    if index is None:
        index = index_bytes(dict(listed if listed is not None else members))
    return ustar.encode([(INDEX_NAME, index), *members])


LAYOUT_CASES = {
    "unlisted": (canonical(("a", A), ("b", B), listed=[("a", A)]), BundleCorruptError,
                 "is corrupt: entry 'b' is not in the index"),
    "missing": (canonical(("a", A), listed=[("a", A), ("b", B)]), BundleCorruptError,
                "is corrupt: the index lists 'b' but the archive has no such entry"),
    "sha256": (canonical(("a", A), listed=[("a", A.upper())]), BundleCorruptError,
               "is corrupt: entry 'a' has sha256 "),
    "size": (canonical(("a", A), listed=[("a", A + b"!")]), BundleCorruptError,
             f"entry 'a' is {len(A)} bytes but the index says {len(A) + 1}"),
    "unsorted": (canonical(("b", B), ("a", A)), BundleFormatError, "entry 'a' comes after 'b'"),
    "index-last": (ustar.encode([("a", A), (INDEX_NAME, index_bytes({"a": A}))]), BundleFormatError,
                   "its first entry is 'a'"),
    "file-and-dir": (canonical(("a", A), ("a/b", B)), BundleFormatError,
                     "entry 'a' is also a directory (of 'a/b')"),
    "pretty-index": (canonical(("a", A), index=json.dumps(json.loads(index_bytes({"a": A})),
                                                          indent=1).encode()),
                     BundleFormatError, "index (DIGESTS.json) that is not in canonical form"),
    "newer-index": (canonical(("a", A), index=index_bytes({"a": A}).replace(b'"format":1', b'"format":2')),
                    BundleFormatError, "its format is 2; this XG reads format 1"),
    "not-json": (canonical(("a", A), index=b"[" * 100000), BundleFormatError, "it is not JSON"),
    "bool-size": (canonical(("a", A), index=index_bytes({"a": A}).replace(b'"size":15', b'"size":true')),
                  BundleFormatError, "its size for 'a' is not a non-negative integer"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_canonical_tars_that_disagree_with_their_index_are_refused(tmp_path, case):
    stream, kind, message = LAYOUT_CASES[case]
    refused(engine_file(tmp_path, forged(stream)), kind, message)


def test_tar_structure_departures_are_refused(tmp_path):
    good = canonical(("a", A))
    data_at = 3 * ustar.BLOCK                               # index header, index, then a's header
    padding_at = data_at + len(A)
    cases = {
        "bad data padding": (good[:padding_at] + b"\x01" + good[padding_at + 1:],
                             "is followed by non-zero padding"),
        "junk after the end": (good[:-1] + b"\x01", "non-zero bytes follow the end-of-archive marker"),
        "an extra record": (good + bytes(ustar.RECORD), "XG writes 10240"),
        "no end marker": (good[:4 * ustar.BLOCK], "ends at offset 2048 without an end marker"),
        "cut in a header": (good[:2 * ustar.BLOCK + 10], "ends at offset 1024 without an end marker"),
        "cut in the data": (good[:data_at + 5], "entry 'a' runs past the end of the tar stream"),
    }
    for label, (stream, message) in cases.items():
        assert refused(engine_file(tmp_path, forged(stream)), BundleFormatError, message), label


# --- size caps -----------------------------------------------------------------------------------


def peak_while(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_decompression_bomb_is_refused_before_allocating(tmp_path):
    compressed = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(bytes(64 << 20))
    bomb = engine_file(tmp_path, sealed(compressed))
    assert bomb.stat().st_size < 64 << 10
    peak = peak_while(lambda: refused(bomb, BundleTooLargeError, "declares 67108864 uncompressed bytes, "
                                      "over the cap of 1048576", max_total_size=1 << 20))
    assert peak < 4 << 20


def test_a_bomb_over_the_default_cap_is_refused_before_allocating(tmp_path):
    # 5 GiB of RLE blocks in 160 KiB: a well-formed frame header, with XG's window and flags.
    size, block = 5 << 30, 128 << 10
    rle = ((block << 3) | (1 << 1)).to_bytes(3, "little") + b"\x00"
    last = ((block << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\x00"
    data = b"\x28\xb5\x2f\xfd\xc4\x68" + size.to_bytes(8, "little") + rle * (size // block - 1) + last + bytes(4)
    bomb = engine_file(tmp_path, sealed(data))
    peak = peak_while(lambda: refused(bomb, BundleTooLargeError, "declares 5368709120 uncompressed bytes"))
    assert peak < 4 << 20


def test_a_frame_that_understates_its_size_cannot_overrun(tmp_path):
    write_bundle(tmp_path / "e.xge", {"zeros": bytes(4 << 20)})
    data = bytearray((tmp_path / "e.xge").read_bytes()[:-frame.SEAL_SIZE])
    # The frame header (RFC 8878 3.1.1.1): descriptor byte, window byte unless single-segment,
    # no dictionary id, then the content size in 2, 4 or 8 bytes.
    fhd = data[4]
    width = {1: 2, 2: 4, 3: 8}[fhd >> 6]
    at = 5 + (0 if fhd & 0x20 else 1)
    assert fhd & 0x03 == 0 and int.from_bytes(data[at:at + width], "little") > 4 << 20    # the tar stream
    data[at:at + width] = (100_000).to_bytes(width, "little")
    lying = engine_file(tmp_path, sealed(bytes(data)))
    peak = peak_while(lambda: refused(lying, BundleCorruptError, "the zstd frame does not decode"))
    assert peak < 2 << 20


def test_the_per_entry_and_file_caps(tmp_path):
    write_bundle(tmp_path / "e.xge", {"big": bytes(2 << 20), "small": A})
    refused(tmp_path / "e.xge", BundleTooLargeError, "entry 'big' is 2097152 bytes, over the cap of 1048576",
            max_entry_size=1 << 20)
    refused(tmp_path / "e.xge", BundleTooLargeError, "over the cap of 1000000", max_total_size=1_000_000)
    big_file = engine_file(tmp_path, small_bundle(tmp_path) + bytes(20000))
    refused(big_file, BundleTooLargeError, "the file is", max_total_size=10000)


# --- the file itself -----------------------------------------------------------------------------


def test_missing_files_directories_and_fifos_are_refused(tmp_path):
    refused(tmp_path / "nope.xge", BundleReadError, "does not exist")
    (tmp_path / "dir.xge").mkdir()
    refused(tmp_path / "dir.xge", BundleReadError, "is a directory")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.xge")
        refused(tmp_path / "fifo.xge", BundleReadError, "is not a regular file")


def test_reading_writes_nothing(tmp_path):
    small_bundle(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    read_bundle(tmp_path / "good.xge")
    assert {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
