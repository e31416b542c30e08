"""Decompression bombs as engines: frames that declare or hold far more than their size, tars whose
headers lie, each refused within seconds and bounded memory; a large sound engine still loads.

Attacks are built as an attacker would: raw zstd frames with RLE blocks and lying content sizes,
sealed with the packager's own seal, or whole bundles written with its own writer (a valid seal).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import zstandard

from .bombs_support import MEMORY_SLACK, assert_refused, build_engine, run_measured, xgrun
from xgbuild.errors import EngineError
from xgbuild.packager import frame, ustar
from xgbuild.packager.archive import (
    RATIO_FLOOR, BundleCorruptError, BundleError, BundleTooLargeError, read_bundle, write_bundle,
)
from xgbuild.packager.digest import INDEX_NAME, index_bytes
from xgbuild.packager.engine_file import read_engine

_BLOCK = 128 << 10


def rle_frame(size: int, prefix: bytes = b"") -> bytes:
    """A zstd frame declaring `size` bytes: `prefix` raw, then zeros as 4-byte RLE blocks (the
    frame a bomb is made of: thousands of times smaller than what it declares)."""
    blocks = []
    if prefix:
        blocks.append(((len(prefix) << 3) | 0).to_bytes(3, "little") + prefix)
    left = size - len(prefix)
    while left:
        n = min(left, _BLOCK)
        left -= n
        blocks.append(((n << 3) | (1 << 1) | (0 if left else 1)).to_bytes(3, "little") + b"\x00")
    # Descriptor 0xc4: 8-byte content size, checksum flag, not single-segment; window 8 MiB.
    return b"\x28\xb5\x2f\xfd\xc4\x68" + size.to_bytes(8, "little") + b"".join(blocks) + bytes(4)


def sealed(compressed: bytes) -> bytes:
    return compressed + frame.seal(compressed, "0" * 64)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return build_engine(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def baseline(engine):
    run = xgrun(engine)
    assert run.code == 0, run.err
    return run.peak_rss


@pytest.mark.timeout(120)
def test_a_small_engine_declaring_four_gib_is_refused_by_xgrun_in_bounded_memory(tmp_path, baseline):
    bomb = tmp_path / "bomb.xge"
    bomb.write_bytes(sealed(rle_frame(4 * 2**30 - 1)))
    assert bomb.stat().st_size < 200 << 10
    started = time.monotonic()
    run = xgrun(bomb)
    assert time.monotonic() - started < 30
    assert_refused(run, "refused as a decompression bomb", "declares 4294967295 uncompressed bytes")
    assert run.peak_rss < baseline + MEMORY_SLACK


@pytest.mark.timeout(60)
def test_a_consistent_bomb_written_with_xgs_own_writer_is_refused(tmp_path):
    # The index, tar and seal are all sound: only the ratio betrays it.
    path = tmp_path / "zeros.xge"
    write_bundle(path, {"kernels/k.cubin": bytes(RATIO_FLOOR + (8 << 20))})
    with pytest.raises(BundleTooLargeError, match="refused as a decompression bomb"):
        read_bundle(path)
    with pytest.raises(EngineError, match="refused as a decompression bomb"):
        read_engine(path)


_READ_WITHOUT_RATIO = (
    "import sys\n"
    "from xgbuild.packager.archive import BundleError, read_bundle\n"
    "try:\n"
    "    read_bundle(sys.argv[1], max_ratio=10**9)\n"
    "except BundleError as e:\n"
    "    print(e)\n"
)


def _tar_declaring(name: str, size: int) -> bytes:
    """A tar stream prefix: a header claiming `size` bytes for `name` (the rest follows as zeros)."""
    return ustar.header(name, size)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first", ["lying-entry", "lying-index"])
def test_with_the_ratio_cap_lifted_a_lying_header_costs_one_block(tmp_path, first):
    # With the ratio cap out of the way, a 3.9 GiB stream of zeros behind one header: refused at
    # the header, before its data is inflated, not after 3.9 GiB.
    size = 4 * 2**30 - 2**26
    if first == "lying-entry":
        head, message = _tar_declaring("kernels/k.cubin", 2**30 - 512), "its first entry is 'kernels/k.cubin'"
    else:
        head, message = _tar_declaring(INDEX_NAME, 2**30 - 512), "its index is 1073741312 bytes, over the cap"
    bomb = tmp_path / "bomb.xge"
    bomb.write_bytes(sealed(rle_frame(size, head)))
    base = run_measured(sys.executable, "-c", "import xgbuild.packager.archive")
    run = run_measured(sys.executable, "-c", _READ_WITHOUT_RATIO, bomb, timeout=100)
    assert run.code == 0, run.err
    assert message in run.out
    assert run.peak_rss < base.peak_rss + MEMORY_SLACK


@pytest.mark.timeout(60)
def test_an_entry_the_index_does_not_list_is_refused_before_its_data(tmp_path):
    index = index_bytes({"a": b"x"})
    stream = (ustar.header(INDEX_NAME, len(index)) + index + bytes(-len(index) % 512)
              + ustar.header("b", 2**30 - 4096))
    bomb = tmp_path / "bomb.xge"
    bomb.write_bytes(sealed(rle_frame(2**30 + 4096, stream)))
    started = time.monotonic()
    with pytest.raises(BundleCorruptError, match="entry 'b' is not in the index"):
        read_bundle(bomb, max_ratio=10**9)
    assert time.monotonic() - started < 5


@pytest.mark.timeout(60)
def test_an_entry_larger_than_the_index_says_is_refused_before_its_data(tmp_path):
    index = index_bytes({"a": b"x"})
    stream = ustar.header(INDEX_NAME, len(index)) + index + bytes(-len(index) % 512) + ustar.header("a", 2**29)
    bomb = tmp_path / "bomb.xge"
    bomb.write_bytes(sealed(rle_frame(2**29 + 8192, stream)))
    started = time.monotonic()
    with pytest.raises(BundleCorruptError, match="entry 'a' is 536870912 bytes but the index says 1"):
        read_bundle(bomb, max_ratio=10**9)
    assert time.monotonic() - started < 5


@pytest.mark.timeout(120)
def test_a_large_sound_engine_still_loads(tmp_path):
    # Weights do not compress: 96 MiB of random bytes, well past the ratio floor, loads whole, and
    # costs about its own size once (the stream is never held whole beside the entries).
    path = tmp_path / "big.xge"
    size = 96 << 20
    write_bundle(path, {"weights.safetensors": os.urandom(size), "manifest.json": b"{}"})
    base = run_measured(sys.executable, "-c", "import xgbuild.packager.archive")
    check = ("import sys\nfrom xgbuild.packager.archive import read_bundle\n"
             "b = read_bundle(sys.argv[1])\nprint(len(b.entries['weights.safetensors']))\n")
    run = run_measured(sys.executable, "-c", check, path, timeout=100)
    assert run.code == 0 and run.out.strip() == str(size), run.err
    assert run.peak_rss < base.peak_rss + 3 * size


def test_the_ratio_floor_lets_small_compressible_engines_through(tmp_path):
    path = tmp_path / "small.xge"
    write_bundle(path, {"sources/a.xg": b"x = 1\n" * (1 << 20)})     # 6 MiB, compresses ~1000x
    assert len(read_bundle(path).entries["sources/a.xg"]) == 6 << 20


def test_a_frame_whose_data_ends_early_is_corrupt_not_a_hang(tmp_path):
    data = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(b"\x00" * 5000)
    lying = bytearray(data)
    # Single-segment frame: the 2-byte content size follows the descriptor; claim more.
    assert lying[4] & 0x20 and lying[4] >> 6 == 1
    lying[5:7] = (20000 - 256).to_bytes(2, "little")
    path = tmp_path / "short.xge"
    path.write_bytes(sealed(bytes(lying)))
    with pytest.raises(BundleError):
        read_bundle(path)


def test_the_seal_mismatch_message_tells_the_digests_apart(tmp_path, engine):
    data = engine.read_bytes()
    compressed = data[:-frame.SEAL_SIZE]
    digest = read_bundle(engine).digest
    forged = digest[:-1] + ("0" if digest[-1] != "0" else "1")       # differs in the last digit only
    path = tmp_path / "resealed.xge"
    path.write_bytes(compressed + frame.seal(compressed, forged))
    with pytest.raises(BundleCorruptError) as caught:
        read_bundle(path)
    message = str(caught.value)
    assert f"records digest {forged} but its contents have {digest}" in message, message


@pytest.mark.timeout(60)
def test_xgrun_refuses_a_resealed_bomb_with_one_line(tmp_path):
    bomb = tmp_path / "zeros.xge"
    write_bundle(bomb, {"manifest.json": b"{}", "kernels/k.cubin": bytes(RATIO_FLOOR * 2)})
    assert_refused(xgrun(bomb), "refused as a decompression bomb")
