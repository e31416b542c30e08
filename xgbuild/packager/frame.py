"""The outer layer of an `.xge`: one zstd frame holding the tar stream, then a seal.

    file = zstd frame (level 9, one thread, content size and content checksum, no dictionary)
         + seal: a zstd skippable frame (magic 0x184D2A5E, length 68) holding
           b"XGE\\x01", the sha256 of the zstd frame's bytes, and the bundle digest (both raw)

Why a seal: zstd's content checksum covers the decompressed bytes only, and a compressed block has
bits no decoder reads (the unused high bits that end an FSE table description, the frame header's
unused bit). Flipping one gives a file that decodes to the same entries: harmless, but a damaged file
passing as sound. The seal's sha256 covers every compressed byte, so any change is refused. It is an
integrity check, not an authentication: whoever can write the file can reseal it; a caller that must
trust a bundle compares `Bundle.digest` with the digest it expects. Decoders skip skippable frames, so
`zstd -dc engine.xge | tar tv` still lists the bundle.

After the seal an engine may carry a trailer: one more skippable frame (magic 0x184D2A5D) holding
signatures and the provenance statement (`signing.py`), as

    magic, u32 length, body (canonical JSON), u32 total length of this frame, b"XGS\x01"

so a reader finds it from the end of the file. The trailer is outside the bundle digest and the
seal: the same sources and winners give the same bundle bytes whoever signs them, and signing an
engine adds a trailer without changing its digest. A reader that does not know the trailer sees a
skippable frame and skips it. `split_trailer` refuses a trailer that is cut short, oversized or
not laid out this way; what its body says is checked by `signing.py`.

The decompressor only runs on a sealed frame that declares its content size within the caller's cap,
and decompresses in one shot into a buffer of exactly that size: a decompression bomb is refused
before anything is allocated, and a frame that understates its size fails instead of growing.
"""

from __future__ import annotations

import hashlib

import zstandard

from xgbuild.packager.archive_errors import (
    BundleError, bad_layout, corrupt, not_an_engine, too_large, truncated,
)

ZSTD_LEVEL = 9           # 16x faster than 19 on engines of cubins, for about 18% more bytes
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_MAX_BLOCK = 128 * 1024
_SEAL_MAGIC = (0x184D2A5E).to_bytes(4, "little")
_SEAL_TAG = b"XGE\x01"
_SEAL_PAYLOAD = len(_SEAL_TAG) + 32 + 32
SEAL_SIZE = 8 + _SEAL_PAYLOAD
_TRAILER_MAGIC = (0x184D2A5D).to_bytes(4, "little")
TRAILER_TAG = b"XGS\x01"
_TRAILER_FOOTER = 4 + len(TRAILER_TAG)
MAX_TRAILER_BODY = 4 * 2**20      # signatures and a provenance statement; thousands of kernels fit


def compress(stream: bytes) -> bytes:
    """The zstd frame of `stream`: a pure function of `stream` for a given zstd library version."""
    # threads=0: zstd's multithreaded mode writes other bytes; one-shot, so the size is known.
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True,
                                          write_content_size=True, write_dict_id=False, threads=0)
    frame = compressor.compress(stream)
    try:
        # Never write what the reader refuses, should a future zstd lay out its frames otherwise.
        _frame_header(frame, "the frame just written", len(stream))
    except BundleError as err:
        raise RuntimeError(f"internal error: zstd {zstandard.ZSTD_VERSION} wrote a frame that XG "
                           f"cannot read back: {err}") from err
    return frame


def seal(frame: bytes, digest: str) -> bytes:
    """The seal that follows `frame` in a bundle whose digest is `digest` (64 hex digits)."""
    payload = _SEAL_TAG + hashlib.sha256(frame).digest() + bytes.fromhex(digest)
    return _SEAL_MAGIC + len(payload).to_bytes(4, "little") + payload


def trailer_frame(body: bytes) -> bytes:
    """The trailer that carries `body` (canonical JSON) after a bundle's seal."""
    if not 0 < len(body) <= MAX_TRAILER_BODY:
        raise ValueError(f"a trailer body is 1 to {MAX_TRAILER_BODY} bytes, got {len(body)}")
    total = 8 + len(body) + _TRAILER_FOOTER
    return (_TRAILER_MAGIC + (len(body) + _TRAILER_FOOTER).to_bytes(4, "little") + body
            + total.to_bytes(4, "little") + TRAILER_TAG)


def split_trailer(data: bytes, where: str) -> tuple[memoryview, bytes | None]:
    """(the sealed bundle, the trailer's body or None) of a whole file.

    A file that ends with a seal has no trailer. Otherwise it must end with one whole trailer,
    within the size cap, right after a seal; anything else is refused here, before the body is
    copied, so a forged length can neither read outside the file nor allocate much.
    """
    view = memoryview(data)
    head = data[-SEAL_SIZE:-SEAL_SIZE + 12]
    if len(data) < SEAL_SIZE or head == _SEAL_MAGIC + _SEAL_PAYLOAD.to_bytes(4, "little") + _SEAL_TAG:
        return view, None
    if data[-len(TRAILER_TAG):] != TRAILER_TAG:
        return view, None               # no trailer: unseal says the seal is missing or damaged
    total = int.from_bytes(data[-_TRAILER_FOOTER:-len(TRAILER_TAG)], "little")
    body_size = total - 8 - _TRAILER_FOOTER
    if not 0 < body_size <= MAX_TRAILER_BODY:
        raise corrupt(where, f"its signature trailer declares {total} bytes; a trailer holds 1 to "
                             f"{MAX_TRAILER_BODY} bytes of signatures and provenance")
    if total > len(data) - SEAL_SIZE:
        raise truncated(where, f"its signature trailer declares {total} bytes but the file has "
                               f"{len(data)} in all")
    start = len(data) - total
    if (data[start:start + 4] != _TRAILER_MAGIC
            or int.from_bytes(data[start + 4:start + 8], "little") != total - 8):
        raise corrupt(where, "its signature trailer does not start where its length says (it was "
                             "cut, damaged or added to)")
    return view[:start], bytes(view[start + 8:len(data) - _TRAILER_FOOTER])


def unseal(data: bytes | memoryview, where: str) -> tuple[memoryview, str]:
    """(zstd frame, digest the seal records) of a sealed bundle (a file less its trailer), once the
    seal matches the frame.

    The frame is a view into `data`, not a copy: a bundle can be gigabytes.
    """
    data = memoryview(data)
    if not data:
        raise not_an_engine(where, "an empty file")
    if bytes(data[:4]) != _ZSTD_MAGIC:
        if _ZSTD_MAGIC.startswith(bytes(data[:4])):
            raise truncated(where, "it ends inside the zstd magic number")
        if bytes(data[257:262]) == b"ustar":
            raise not_an_engine(where, "an uncompressed tar, not a zstd stream")
        raise not_an_engine(where, "not a zstd stream")
    head = bytes(data[-SEAL_SIZE:-SEAL_SIZE + 8])
    if len(data) < SEAL_SIZE + 4 or head != _SEAL_MAGIC + _SEAL_PAYLOAD.to_bytes(4, "little"):
        raise corrupt(where, "it does not end with XG's seal (it was cut short, or its end was "
                             "damaged or added to)")
    frame, payload = data[:-SEAL_SIZE], bytes(data[-_SEAL_PAYLOAD:])
    if payload[:4] != _SEAL_TAG:
        raise bad_layout(where, f"its seal has tag {payload[:4]!r}; this XG reads {_SEAL_TAG!r}")
    if hashlib.sha256(frame).digest() != payload[4:36]:
        raise corrupt(where, "its compressed bytes do not match the sha256 recorded in its seal")
    return frame, payload[36:].hex()


def _frame_header(frame: bytes | memoryview, where: str, max_size: int) -> int:
    """The header length of `frame`, after checking its flags and that it declares a content size
    of at most `max_size`."""
    if len(frame) < 6:
        raise truncated(where, "the zstd frame header is cut short")
    descriptor = frame[4]
    fcs_code, single_segment = descriptor >> 6, bool(descriptor & 0x20)
    if descriptor & 0x08:
        raise corrupt(where, "the zstd frame header has its reserved bit set")
    if descriptor & 0x03:
        raise bad_layout(where, "the zstd frame needs a dictionary; XG writes none")
    if not descriptor & 0x04:
        raise bad_layout(where, "the zstd frame has no content checksum; XG always writes one")
    if fcs_code == 0 and not single_segment:
        raise bad_layout(where, "the zstd frame does not declare its content size; XG always does")
    fcs_length = (1, 2, 4, 8)[fcs_code]
    length = 5 + (0 if single_segment else 1) + fcs_length
    if len(frame) < length:
        raise truncated(where, "the zstd frame header is cut short")
    size = int.from_bytes(frame[length - fcs_length:length], "little") + (256 if fcs_code == 1 else 0)
    # The bomb guard: the one-shot decoder allocates the declared size and never more.
    if size > max_size:
        raise too_large(where, f"it declares {size} uncompressed bytes, over the cap of {max_size}")
    return length


def _frame_end(frame: bytes | memoryview, position: int, where: str) -> int:
    """The offset just past the frame whose blocks start at `position`, its checksum included."""
    while True:
        if position + 3 > len(frame):
            raise truncated(where, "the zstd frame ends inside a block header")
        head = int.from_bytes(frame[position:position + 3], "little")
        kind, size = head >> 1 & 3, head >> 3
        if kind == 3:
            raise corrupt(where, f"the zstd block at offset {position} has the reserved type")
        if size > _ZSTD_MAX_BLOCK:
            raise corrupt(where, f"the zstd block at offset {position} claims {size} bytes, "
                                 "over 128 KiB")
        position += 3 + (1 if kind == 1 else size)      # kind 1 (RLE) stores one byte
        if position > len(frame):
            raise truncated(where, "the zstd frame ends inside a block")
        if head & 1:
            return position + 4


def decompress(frame: bytes | memoryview, where: str, max_size: int) -> bytes:
    """The tar stream in `frame`, which must be exactly one zstd frame of at most `max_size` bytes."""
    end = _frame_end(frame, _frame_header(frame, where, max_size), where)
    if end > len(frame):
        raise truncated(where, "the zstd frame ends before its checksum")
    if end < len(frame):
        raise bad_layout(where, f"{len(frame) - end} bytes follow the zstd frame")
    try:
        stream = zstandard.ZstdDecompressor().decompress(frame, allow_extra_data=False)
    except zstandard.ZstdError as err:
        reason = " ".join(str(err).split())
        raise corrupt(where, f"the zstd frame does not decode ({reason})") from None
    if len(stream) != zstandard.frame_content_size(frame):
        raise corrupt(where, "the zstd frame does not give the size it declares")
    return stream
