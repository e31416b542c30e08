"""Stored entries: tensor data (`*.safetensors`) lies in the engine file as it is, page-aligned,
after the zstd frame, and `read_bundle` hands it back as a view of the mapped file. The digest is
the same as with the data compressed, engines of the older layout still read, and every damage to a
stored entry, its header or its padding is refused with one line."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

import pytest
import zstandard

from xgbuild.packager import frame, ustar
from xgbuild.packager.archive import (
    INDEX_NAME, BundleCorruptError, BundleEntryError, BundleError, BundleFormatError,
    BundleTooLargeError, bundle_digest_of, read_bundle, write_bundle,
)
from xgbuild.packager.digest import digest_of_index, index_bytes
from test_archive_refusals import refused  # noqa: E402  (one way of saying "refused, in one line")

WEIGHTS = "weights.safetensors"


def entries(size: int = 10_000, seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {"manifest.json": b'{"format":1}', "kernels/k0.cubin": b"cubin" * 50,
            WEIGHTS: rng.randbytes(size), "z/other.safetensors": rng.randbytes(size // 3 + 1)}


def layout(data: bytes) -> tuple[int, list[tuple[int, str, int, int]]]:
    """(end of the zstd frame, [(frame start, name, data start, data end)]) of a written bundle,
    read independently of the reader under test."""
    body = data[:-frame.SEAL_SIZE]
    end = frame._frame_end(body, frame._frame_header(body, "t", 2**40), "t")
    found, at = [], end
    while at < len(body):
        assert body[at:at + 4] == (0x184D2A5C).to_bytes(4, "little")
        length = int.from_bytes(body[at + 4:at + 8], "little")
        n = int.from_bytes(body[at + 12:at + 14], "little")
        name = body[at + 14:at + 14 + n].decode()
        size = int.from_bytes(body[at + 14 + n:at + 22 + n], "little")
        found.append((at, name, at + 8 + length - size, at + 8 + length))
        at += 8 + length
    return end, found


def test_tensor_data_is_stored_as_it_is_on_page_boundaries_and_read_back_as_a_view(tmp_path):
    e = entries()
    digest = write_bundle(tmp_path / "e.xge", e)
    data = (tmp_path / "e.xge").read_bytes()
    end, stored = layout(data)
    assert [s[1] for s in stored] == [WEIGHTS, "z/other.safetensors"]
    for _, name, start, stop in stored:
        assert start % 4096 == 0 and data[start:stop] == e[name]
    # The zstd frame holds the rest: zstd and tar see every entry but the stored ones.
    stream = zstandard.ZstdDecompressor().decompress(data[:end])
    names = [m.name for m in tarfile.open(fileobj=io.BytesIO(stream))]
    assert names == [INDEX_NAME, "kernels/k0.cubin", "manifest.json"]
    bundle = read_bundle(tmp_path / "e.xge")
    assert bundle.digest == digest == bundle_digest_of(e)
    assert dict(bundle.entries) == e
    view = bundle.entries[WEIGHTS]
    assert isinstance(view, memoryview) and view.readonly
    assert isinstance(bundle.entries["manifest.json"], bytes)
    assert bundle.sha256s[WEIGHTS] == hashlib.sha256(e[WEIGHTS]).hexdigest()


def test_the_same_entries_give_the_same_bytes_and_a_bundle_read_back_writes_itself_again(tmp_path):
    e = entries(seed=3)
    write_bundle(tmp_path / "a.xge", e)
    write_bundle(tmp_path / "b.xge", dict(reversed(list(e.items()))))
    assert (tmp_path / "a.xge").read_bytes() == (tmp_path / "b.xge").read_bytes()
    again = read_bundle(tmp_path / "a.xge")
    write_bundle(tmp_path / "c.xge", again.entries)          # stored entries as views: no copy
    assert (tmp_path / "c.xge").read_bytes() == (tmp_path / "a.xge").read_bytes()


def test_an_engine_of_the_older_layout_with_its_tensor_data_compressed_still_reads(tmp_path):
    e = entries(seed=5)
    index = index_bytes(e)
    stream = ustar.encode([(INDEX_NAME, index), *((n, e[n]) for n in sorted(e))])
    compressed = frame.compress(stream)
    digest = digest_of_index(index)
    (tmp_path / "old.xge").write_bytes(compressed + frame.seal(compressed, digest))
    bundle = read_bundle(tmp_path / "old.xge")
    assert bundle.digest == digest == write_bundle(tmp_path / "new.xge", e)
    assert dict(bundle.entries) == e


def test_a_writable_buffer_is_refused_as_an_entry(tmp_path):
    with pytest.raises(BundleEntryError, match=f"entry '{WEIGHTS}' must be bytes"):
        write_bundle(tmp_path / "e.xge", {WEIGHTS: memoryview(bytearray(b"x" * 10))})


def resealed(data: bytes, edit) -> bytes:
    """`data` with `edit(bytearray of the bundle less its seal)` applied, then sealed again the way
    a careful forger would (the seal's sha256 recomputed over the edited headers)."""
    digest = data[-32:].hex()
    body = bytearray(data[:-frame.SEAL_SIZE])
    edit(body)
    end, stored = layout(bytes(body))
    heads = [bytes(body[at:start]) for at, _, start, _ in stored]
    return bytes(body) + frame.seal(bytes(body[:end]), digest, heads)


@pytest.fixture
def written(tmp_path) -> bytes:
    write_bundle(tmp_path / "e.xge", entries(seed=7))
    return (tmp_path / "e.xge").read_bytes()


def put(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "crafted.xge"
    path.write_bytes(data)
    return path


def test_damage_to_stored_data_is_refused(tmp_path, written):
    _, stored = layout(written)
    start = stored[0][2]
    for at in (start, start + 4999, stored[0][3] - 1, stored[1][2]):
        bad = bytearray(written)
        bad[at] ^= 0x10
        refused(put(tmp_path, bytes(bad)), BundleCorruptError, "but the index says")


def test_damage_to_a_stored_header_or_its_padding_is_refused(tmp_path, written):
    _, stored = layout(written)
    at, _, start, _ = stored[0]
    for offset in (at + 9, at + 13, at + 15, start - 1, start - 4000):
        bad = bytearray(written)
        bad[offset] ^= 0x01
        refused(put(tmp_path, bytes(bad)))
    for offset in (at + 15, start - 1):         # what the layout allows, the seal refuses
        bad = bytearray(written)
        bad[offset] ^= 0x01
        refused(put(tmp_path, bytes(bad)), BundleCorruptError)


def test_forged_stored_entries_are_refused_even_resealed(tmp_path, written):
    _, stored = layout(written)
    at, name, start, stop = stored[0]

    def padding(body):
        body[start - 1] = 7
    refused(put(tmp_path, resealed(written, padding)), BundleCorruptError, "has padding that is not zero")

    def rename(body):       # same length, another name: not in the index
        body[at + 14] = ord("v")
    refused(put(tmp_path, resealed(written, rename)), BundleCorruptError,
            "stored entry 'veights.safetensors' is not in the index")

    def not_tensor_data(body):
        n = len(name)
        body[at + 14 + n - 11:at + 14 + n] = b"_safetensor"
    refused(put(tmp_path, resealed(written, not_tensor_data)), BundleFormatError, "cannot be stored")

    def size(body):
        n = len(name)
        body[at + 14 + n:at + 22 + n] = (stop - start + 1).to_bytes(8, "little")
    refused(put(tmp_path, resealed(written, size)), BundleCorruptError, "which do not end its frame")

    def tag(body):
        body[at + 11] = 2
    refused(put(tmp_path, resealed(written, tag)), BundleFormatError, "has tag b'XGR\\x02'")

    second_at = stored[1][0]

    def order(body):        # the second entry's name sorts before the first's
        body[second_at + 14] = ord("a")
    refused(put(tmp_path, resealed(written, order)), BundleFormatError, "comes after")


def test_bytes_between_the_frame_and_the_seal_that_are_not_stored_entries_are_refused(tmp_path, written):
    end, _ = layout(written)
    body, seal = written[:-frame.SEAL_SIZE], written[-frame.SEAL_SIZE:]
    refused(put(tmp_path, body + b"junk" * 4 + seal), BundleError)
    # a stored-entry frame cut short, resealed
    digest = written[-32:].hex()
    cut = body[:end] + body[end:end + 12]
    refused(put(tmp_path, cut + frame.seal(body[:end], digest, [body[end:end + 12]])), BundleError, "cut short")


def test_cut_files_and_caps(tmp_path, written):
    _, stored = layout(written)
    for keep in (stored[0][2] + 10, stored[1][0] + 3, len(written) - 1):
        refused(put(tmp_path, written[:keep]), BundleError)
    path = put(tmp_path, written)
    refused(path, BundleTooLargeError, "over the cap", max_entry_size=5_000)
    refused(path, BundleTooLargeError, max_total_size=8_000)
    assert read_bundle(path).entries[WEIGHTS] == entries(seed=7)[WEIGHTS]
