"""The outer layer of an `.xge`: one zstd frame holding the tar stream, the stored entries, then a
seal.

    file = zstd frame (level 9, one thread, content size and content checksum, no dictionary)
         + stored entries, each a zstd skippable frame (magic 0x184D2A5C) holding
           b"XGR\\x01", u16 name length, the name (ASCII), u64 size, zero bytes up to the next
           multiple of 4096 in the file, then the entry's bytes as they are
         + seal: a zstd skippable frame (magic 0x184D2A5E, length 68) holding a tag, the sha256 of
           everything before the seal except the stored entries' bytes, and the bundle digest (both
           raw). The tag is b"XGE\\x01" for a bundle with no stored entries (then the sha256 is the
           zstd frame's, as XG has always written it) and b"XGE\\x02" for one with some.

Stored entries are the tensor data (weights): they compress poorly (a fifth at best, for bf16
noise), and stored as they are, a reader maps them from the file and hands them to the GPU without
decompressing or copying them; each starts on a page boundary. Their bytes are covered by the
index's sha256 of them, inside the bundle digest, so the seal leaves them out rather than read
them twice. The zstd frame holds every other entry; `zstd -dc engine.xge | tar tv` lists those.

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
and streams: the reader asks for each piece after checking it against what the frame and the tar
headers declare, so a bomb is refused before its bytes are inflated, and a frame that understates
its size fails instead of growing.
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
_SEAL_TAG_STORED = b"XGE\x02"
_STORED_MAGIC = (0x184D2A5C).to_bytes(4, "little")
_STORED_TAG = b"XGR\x01"
STORED_ALIGN = 4096
MAX_STORED_SIZE = 2**32 - 1 - 4 - 2 - 255 - 8 - STORED_ALIGN     # one skippable frame's length field
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


def stored_header(name: str, size: int, offset: int) -> bytes:
    """The bytes before the data of the stored entry `name` of `size` bytes whose frame starts at
    `offset` in the file: the frame's magic and length, the tag, the name, the size and the zero
    padding that starts the data on a page boundary."""
    raw = name.encode("ascii")
    fixed = 8 + len(_STORED_TAG) + 2 + len(raw) + 8
    pad = -(offset + fixed) % STORED_ALIGN
    length = fixed - 8 + pad + size
    return (_STORED_MAGIC + length.to_bytes(4, "little") + _STORED_TAG + len(raw).to_bytes(2, "little")
            + raw + size.to_bytes(8, "little") + bytes(pad))


def seal(frame: bytes, digest: str, stored_headers: tuple[bytes, ...] | list[bytes] = ()) -> bytes:
    """The seal that follows `frame` and the stored entries whose headers are `stored_headers`, in
    a bundle whose digest is `digest` (64 hex digits)."""
    sha = hashlib.sha256(frame)
    for head in stored_headers:
        sha.update(head)
    payload = (_SEAL_TAG_STORED if stored_headers else _SEAL_TAG) + sha.digest() + bytes.fromhex(digest)
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
    head = bytes(view[-SEAL_SIZE:-SEAL_SIZE + 12])
    if len(data) < SEAL_SIZE or head in (_SEAL_MAGIC + _SEAL_PAYLOAD.to_bytes(4, "little") + tag
                                         for tag in (_SEAL_TAG, _SEAL_TAG_STORED)):
        return view, None
    if bytes(view[-len(TRAILER_TAG):]) != TRAILER_TAG:
        return view, None               # no trailer: unseal says the seal is missing or damaged
    total = int.from_bytes(view[-_TRAILER_FOOTER:-len(TRAILER_TAG)], "little")
    body_size = total - 8 - _TRAILER_FOOTER
    if not 0 < body_size <= MAX_TRAILER_BODY:
        raise corrupt(where, f"its signature trailer declares {total} bytes; a trailer holds 1 to "
                             f"{MAX_TRAILER_BODY} bytes of signatures and provenance")
    if total > len(data) - SEAL_SIZE:
        raise truncated(where, f"its signature trailer declares {total} bytes but the file has "
                               f"{len(data)} in all")
    start = len(data) - total
    if (bytes(view[start:start + 4]) != _TRAILER_MAGIC
            or int.from_bytes(view[start + 4:start + 8], "little") != total - 8):
        raise corrupt(where, "its signature trailer does not start where its length says (it was "
                             "cut, damaged or added to)")
    return view[:start], bytes(view[start + 8:len(data) - _TRAILER_FOOTER])


def unseal(data: bytes | memoryview, where: str) -> tuple[memoryview, str, dict[str, memoryview]]:
    """(zstd frame, digest the seal records, stored entries by name) of a sealed bundle (a file
    less its trailer), once the seal matches the frame and the stored entries' headers.

    The frame and the stored entries are views into `data`, not copies: a bundle can be gigabytes.
    The stored entries' bytes are not checked here: the index's sha256s cover them.
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
    body, payload = data[:-SEAL_SIZE], bytes(data[-_SEAL_PAYLOAD:])
    if payload[:4] not in (_SEAL_TAG, _SEAL_TAG_STORED):
        raise bad_layout(where, f"its seal has tag {payload[:4]!r}; this XG reads {_SEAL_TAG!r} "
                                f"and {_SEAL_TAG_STORED!r}")
    stored: dict[str, memoryview] = {}
    if payload[:4] == _SEAL_TAG:
        frame, sha = body, hashlib.sha256(body)
    else:
        end = _frame_end(body, _frame_header(body, where, 2**64), where)
        if end > len(body):
            raise truncated(where, "the zstd frame ends before its checksum")
        frame, sha = body[:end], hashlib.sha256(body[:end])
        stored = _stored_entries(body, end, where, sha)
        if not stored:
            raise bad_layout(where, "its seal says it holds stored entries, but none follow the zstd frame")
    if sha.digest() != payload[4:36]:
        raise corrupt(where, "its compressed bytes do not match the sha256 recorded in its seal")
    return frame, payload[36:].hex(), stored


def _stored_entries(body: memoryview, position: int, where: str, sha) -> dict[str, memoryview]:
    """The stored entries from `position` to the end of `body` (the bundle less its seal), in file
    order, each header checked and added to `sha`; their data are views, unread."""
    stored: dict[str, memoryview] = {}
    previous = ""
    while position < len(body):
        at = f"the stored entry at offset {position}"
        if len(body) - position < 8 + len(_STORED_TAG) + 2:
            raise truncated(where, f"{at} is cut short")
        if bytes(body[position:position + 4]) != _STORED_MAGIC:
            raise bad_layout(where, f"unexpected bytes at offset {position}, after the zstd frame "
                                    "(XG writes only stored entries there)")
        end = position + 8 + int.from_bytes(body[position + 4:position + 8], "little")
        if end > len(body):
            raise truncated(where, f"{at} declares {end - position} bytes, past the end of the file")
        cursor = position + 8
        if bytes(body[cursor:cursor + 4]) != _STORED_TAG:
            raise bad_layout(where, f"{at} has tag {bytes(body[cursor:cursor + 4])!r}; this XG reads "
                                    f"{_STORED_TAG!r}")
        name_length = int.from_bytes(body[cursor + 4:cursor + 6], "little")
        cursor += 6
        if cursor + name_length + 8 > end:
            raise corrupt(where, f"{at} is shorter than its own header")
        try:
            name = bytes(body[cursor:cursor + name_length]).decode("ascii")
        except UnicodeDecodeError:
            raise corrupt(where, f"{at} has a name that is not ASCII") from None
        size = int.from_bytes(body[cursor + name_length:cursor + name_length + 8], "little")
        start = end - size
        if size > end - cursor or start - (cursor + name_length + 8) >= STORED_ALIGN or start % STORED_ALIGN:
            raise corrupt(where, f"{at} ({name!r}) declares {size} bytes, which do not end its frame "
                                 f"after the padding to a {STORED_ALIGN}-byte boundary")
        if any(body[cursor + name_length + 8:start]):
            raise corrupt(where, f"{at} ({name!r}) has padding that is not zero")
        if name <= previous:
            raise bad_layout(where, f"stored entry {name!r} comes after {previous!r}; XG writes them "
                                    "once each, in sorted order")
        sha.update(body[position:start])
        stored[name] = body[start:end]
        previous, position = name, end
    return stored


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
    # The first bomb guard: the size the caller allows, checked before anything is decoded.
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


class FrameReader:
    """Reads the tar stream out of one checked zstd frame, a piece at a time, never past the size
    the frame declares: memory follows what the caller asks for, not what the frame claims."""

    def __init__(self, frame: bytes | memoryview, where: str, size: int) -> None:
        self.where, self.size, self.position = where, size, 0
        # The window is capped (zstd's own default limit, said out loud): a frame asking for more is
        # refused instead of allocating it. XG's level-9 frames use 8 MiB at most.
        decompressor = zstandard.ZstdDecompressor(max_window_size=1 << 27)
        self._reader = decompressor.stream_reader(frame, read_across_frames=False)

    def read(self, n: int) -> bytes:
        """The next `n` bytes of the stream; the caller has checked `n` against `remaining`."""
        if n > self.size - self.position:
            raise RuntimeError("internal error: read past the frame's declared size")
        parts, left = [], n
        while left:
            part = self._decode(left)
            if not part:
                raise corrupt(self.where, f"the zstd frame ends after {self.position} of the "
                                          f"{self.size} bytes it declares")
            parts.append(part)
            left -= len(part)
            self.position += len(part)
        return b"".join(parts) if len(parts) != 1 else parts[0]

    @property
    def remaining(self) -> int:
        return self.size - self.position

    def finish(self) -> None:
        """Check that the frame ends where it says, and its checksum (zstd checks it at the end)."""
        if self.position != self.size or self._decode(1):
            raise corrupt(self.where, "the zstd frame does not give the size it declares")

    def _decode(self, n: int) -> bytes:
        try:
            return self._reader.read(n)
        except zstandard.ZstdError as err:
            reason = " ".join(str(err).split())
            raise corrupt(self.where, f"the zstd frame does not decode ({reason})") from None


def open_frame(frame: bytes | memoryview, where: str, max_size: int) -> FrameReader:
    """A reader of the tar stream in `frame`, which must be exactly one zstd frame declaring at
    most `max_size` bytes. Nothing is decompressed yet."""
    end = _frame_end(frame, _frame_header(frame, where, max_size), where)
    if end > len(frame):
        raise truncated(where, "the zstd frame ends before its checksum")
    if end < len(frame):
        raise bad_layout(where, f"{len(frame) - end} bytes follow the zstd frame")
    return FrameReader(frame, where, zstandard.frame_content_size(frame))
