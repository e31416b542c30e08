"""The tar stream inside an `.xge`: one canonical ustar encoding, and a strict parser for it.

XG writes its own 512-byte headers instead of calling `tarfile` because tarfile's bytes are a function
of the Python release, not only of the members: recent CPython releases leave devmajor/devminor as NULs
for regular files where older ones wrote "0000000\\0", the default format moved from GNU to PAX in 3.8,
and the name encoding follows the file-system encoding. Here a header is a pure function of
(name, size); `tarfile`, GNU tar and bsdtar read the stream as plain ustar (a test checks with tarfile).

One member is a header block, the data, and NUL padding to a 512-byte boundary. After the last member
come two zero blocks and zero padding to a 10240-byte record, as tar(1) and tarfile write. Every header:

    name, prefix   the entry name; a name over 100 bytes is split at the first '/' that leaves at most
                   155 bytes before it and 100 after (tarfile's rule)
    mode 0000644   uid, gid 0000000   mtime 00000000000   typeflag '0' (regular file)
    linkname, uname, gname, devmajor, devminor empty   magic "ustar\\0", version "00"

The parser accepts exactly these bytes. Anything else is refused, naming the member and the field.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, Protocol

from xgbuild.packager.archive_errors import bad_layout, bad_name, shown, too_large

BLOCK = 512
RECORD = 20 * BLOCK
MAX_SIZE = 8**11 - 1                        # the largest size the 11 octal digits of `size` hold
_ZERO_BLOCK = bytes(BLOCK)
_SIZE_FIELD = re.compile(rb"[0-7]{11}\x00")

# (field, offset, length): the POSIX ustar header.
_FIELDS = (
    ("name", 0, 100), ("mode", 100, 8), ("uid", 108, 8), ("gid", 116, 8), ("size", 124, 12),
    ("mtime", 136, 12), ("chksum", 148, 8), ("typeflag", 156, 1), ("linkname", 157, 100),
    ("magic", 257, 6), ("version", 263, 2), ("uname", 265, 32), ("gname", 297, 32),
    ("devmajor", 329, 8), ("devminor", 337, 8), ("prefix", 345, 155), ("padding", 500, 12),
)
_FIXED = {
    "mode": b"0000644\x00", "uid": b"0000000\x00", "gid": b"0000000\x00",
    "mtime": b"00000000000\x00", "typeflag": b"0", "magic": b"ustar\x00", "version": b"00",
}
_KINDS = {
    b"\x00": "an old-style regular file (typeflag NUL)", b"1": "a hard link", b"2": "a symbolic link",
    b"3": "a character device", b"4": "a block device", b"5": "a directory", b"6": "a FIFO",
    b"7": "a contiguous file", b"x": "a pax extended header", b"g": "a pax global header",
    b"L": "a GNU long-name record", b"K": "a GNU long-link record",
}


def split_name(name: str) -> tuple[str, str] | None:
    """(prefix, name) as the header stores `name`, or None when no ustar header can hold it."""
    if len(name) <= 100:
        return "", name
    parts = name.split("/")
    for i in range(1, len(parts)):
        head, tail = "/".join(parts[:i]), "/".join(parts[i:])
        if len(head) <= 155 and len(tail) <= 100:
            return head, tail
    return None


def header(name: str, size: int) -> bytes:
    """The header block of a regular file `name` of `size` bytes (`name` already validated)."""
    split = split_name(name)
    if split is None or not name.isascii() or not 0 <= size <= MAX_SIZE:
        raise ValueError(f"no ustar header holds {name!r} of {size} bytes")
    values = dict(_FIXED, name=split[1].encode("ascii"), prefix=split[0].encode("ascii"),
                  size=b"%011o\x00" % size, chksum=b" " * 8)
    block = bytearray(BLOCK)
    for field, offset, _length in _FIELDS:
        value = values.get(field, b"")
        block[offset:offset + len(value)] = value
    # The checksum is the byte sum with its own field read as spaces; written "%06o\0 " as tar does.
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def _padding(size: int) -> int:
    return -size % BLOCK


def encode(members: Iterable[tuple[str, bytes]]) -> bytes:
    """The canonical stream holding `members` in the order given."""
    parts: list[bytes] = []
    length = 0
    for name, data in members:
        pad = bytes(_padding(len(data)))
        parts += (header(name, len(data)), data, pad)
        length += BLOCK + len(data) + len(pad)
    end = length + 2 * BLOCK
    parts.append(bytes(2 * BLOCK + -end % RECORD))
    return b"".join(parts)


def _cstr(field: bytes) -> bytes:
    return field.split(b"\x00", 1)[0]


def _first_difference(block: bytes, expected: bytes) -> str:
    # The checksum differs whenever another field does: name it only when it is the one difference.
    for field, offset, length in _FIELDS:
        if field != "chksum" and block[offset:offset + length] != expected[offset:offset + length]:
            return field
    return "chksum"


class Reader(Protocol):
    """What `read_members` reads from: `frame.FrameReader`, a stream of known length."""

    remaining: int

    def read(self, n: int) -> bytes: ...


def _header(block: bytes, pos: int, where: str, max_entry_size: int,
            name_problem: Callable[[str], str | None]) -> tuple[str, int]:
    """(name, size) of the header `block` at `pos`, checked in the order that gives the clearest
    message; only the header is looked at, so nothing of the data has been read yet."""
    posix = block[257:265] == b"ustar\x0000"
    if not posix and block[257:265] != b"ustar  \x00":       # a GNU header is refused below, by kind
        raise bad_layout(where, f"the tar header at offset {pos} is not a POSIX ustar header")
    raw = _cstr(block[0:100])
    if posix and _cstr(block[345:500]):                     # GNU keeps other fields there
        raw = _cstr(block[345:500]) + b"/" + raw
    name = raw.decode("latin-1")
    kind = block[156:157]
    if kind != b"0":
        what = _KINDS.get(kind, f"of unknown type {kind!r}")
        raise bad_layout(where, f"entry {shown(name)} is {what}; only regular files are allowed")
    problem = name_problem(name) if raw.isascii() else "it holds a non-ASCII byte"
    if problem:
        raise bad_name(where, name, problem)
    if not _SIZE_FIELD.fullmatch(block[124:136]):
        raise bad_layout(where, f"entry {shown(name)} has a malformed size field")
    size = int(block[124:135], 8)
    if size > max_entry_size:
        raise too_large(where, f"entry {shown(name)} is {size} bytes, over the cap of {max_entry_size}")
    expected = header(name, size)
    if block != expected:
        field = _first_difference(block, expected)
        raise bad_layout(where, f"entry {shown(name)} has a tar header XG does not write "
                                f"(field {field})")
    return name, size


def _check_end(reader: Reader, pos: int, where: str) -> None:
    """The zero block at `pos` has been read: the rest must be zeros up to the record's end."""
    end = pos + 2 * BLOCK + -(pos + 2 * BLOCK) % RECORD
    total = pos + BLOCK + reader.remaining
    if total != end:
        raise bad_layout(where, f"the tar stream is {total} bytes, but with its end marker at "
                                f"offset {pos} XG writes {end}")
    rest = reader.read(reader.remaining)
    if rest.count(0) != len(rest):
        raise bad_layout(where, "non-zero bytes follow the end-of-archive marker")


def read_members(reader: Reader, where: str, *, max_entry_size: int,
                 name_problem: Callable[[str], str | None],
                 admit: Callable[[str, int], None]) -> Iterator[tuple[str, bytes]]:
    """The (name, data) of each member of a canonical stream, in stream order; any departure raises
    a `BundleError`.

    Each header is checked (`name_problem` gives the reason a name is not allowed, or None) and its
    size against `max_entry_size` and the bytes left in the stream, then `admit(name, size)` may
    refuse it by raising, all before its data is read: a lying header costs 512 bytes, not its size.
    """
    pos = 0
    while True:
        if reader.remaining < BLOCK:
            raise bad_layout(where, f"the tar stream ends at offset {pos} without an end marker")
        block = reader.read(BLOCK)
        if block == _ZERO_BLOCK:
            _check_end(reader, pos, where)
            return
        name, size = _header(block, pos, where, max_entry_size, name_problem)
        pad = _padding(size)
        if size + pad > reader.remaining:
            raise bad_layout(where, f"entry {shown(name)} runs past the end of the tar stream")
        admit(name, size)
        data = reader.read(size)
        if reader.read(pad).count(0) != pad:
            raise bad_layout(where, f"entry {shown(name)} is followed by non-zero padding")
        yield name, data
        pos += BLOCK + size + pad
