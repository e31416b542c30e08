"""The `.xge` container: a deterministic zstd-compressed ustar archive, and a reader that verifies it.

Layout, outside in:

* the file is one zstd frame (level 9, one thread, content size and checksum written, no
  dictionary), then the stored entries as they are (tensor data: `*.safetensors`), each in a zstd
  skippable frame and starting on a page boundary, then a seal: a zstd skippable frame with the
  sha256 of the frame's bytes and the stored entries' headers, and the bundle digest (`frame.py`);
* the frame holds a canonical ustar stream (`ustar.py`): the index `DIGESTS.json` first, then every
  entry but the stored ones in sorted name order, each with fixed header fields (mode 0644, owner
  0, mtime 0, no PAX);
* the index lists every other entry's sha256 and size; the bundle digest is the sha256 of the
  index's canonical bytes (`digest.py`): a digest over the contents, whatever the compression;
* after the seal, optionally, a trailer of signatures and provenance (`frame.py`, `signing.py`),
  outside the digest: the bundle's bytes are the file's bytes up to the end of the seal.

`write_bundle` and `bundle_digest_of` are pure functions of the entries: no clock, user, umask,
directory, locale, time zone or hash seed reaches the bytes. The compressed bytes also depend on the
zstd library version (bundled with the `zstandard` package); the digest does not.

`read_bundle` maps the file into memory (a stored entry is a view of the mapping: weights reach the
GPU without being decompressed or copied on the host) and returns only after checking everything: a
regular file within the caps; the seal against every compressed byte and every stored entry's
header; each stored entry against the index's sha256 (its bytes hashed once); the frame's header, block structure and declared size against the caps
and the compression ratio before anything is decompressed; every tar header byte for byte against
what the writer produces, and against the index's name and size, before its data is decompressed;
every name; every entry against the index; the zstd checksum; the digest against the seal. It never
writes, never follows a link inside the archive (none is allowed) and reads nothing but `path`.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from xgbuild.packager import frame, ustar
from xgbuild.packager.archive_errors import (
    BundleCorruptError, BundleEntryError, BundleError, BundleFormatError, BundleReadError,
    BundleTooLargeError, bad_entry, bad_entry_name, bad_layout, corrupt, shown, too_large,
    unreadable,
)
from xgbuild.packager.digest import (
    INDEX_NAME, digest_of_index, index_bytes, index_mismatch, listing_of, name_conflict,
    name_problem,
)

__all__ = [
    "Bundle", "BundleCorruptError", "BundleEntryError", "BundleError", "BundleFormatError",
    "BundleReadError", "BundleTooLargeError", "DEFAULT_MAX_ENTRY_SIZE", "DEFAULT_MAX_RATIO",
    "DEFAULT_MAX_TOTAL_SIZE", "INDEX_NAME", "RATIO_FLOOR", "bundle_bytes", "bundle_digest_of",
    "bundle_from_bytes", "read_bundle", "read_bundle_file", "write_bundle",
]

DEFAULT_MAX_TOTAL_SIZE = 4 * 2**30          # uncompressed tar stream, headers included
DEFAULT_MAX_ENTRY_SIZE = 2**30
DEFAULT_MAX_RATIO = 64
RATIO_FLOOR = 32 * 2**20                    # below this, any ratio: too small to hurt as a bomb
MAX_INDEX_SIZE = 16 * 2**20                 # ~150k entries; read whole before any entry is admitted
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)    # POSIX only
_O_BINARY = getattr(os, "O_BINARY", 0)      # Windows only
STORED_SUFFIXES = (".safetensors",)        # tensor data: stored as it is, outside the zstd frame


def is_stored(name: str) -> bool:
    """Whether the entry `name` is stored uncompressed after the zstd frame (see `frame.py`)."""
    return name.endswith(STORED_SUFFIXES)


@dataclass(frozen=True)
class Bundle:
    """A verified engine bundle: its digest and its entries (the index left out) in name order,
    with each entry's sha256 (as the index lists it, checked against the bytes).

    The digest determines the entries, so two Bundles are equal, and hash alike, when their digests
    are equal.
    """

    digest: str
    entries: Mapping[str, bytes] = field(compare=False, repr=False)
    sha256s: Mapping[str, str] = field(compare=False, repr=False, default_factory=dict)
    trailer: bytes | None = field(default=None, compare=False, repr=False)   # its body: JSON, unchecked
    sealed_size: int = field(default=0, compare=False, repr=False)          # bytes up to the seal's end

    def __post_init__(self) -> None:
        # A read-only view of a private dict: what was verified cannot be edited through the Bundle.
        object.__setattr__(self, "entries", MappingProxyType(dict(sorted(self.entries.items()))))
        object.__setattr__(self, "sha256s", MappingProxyType(dict(self.sha256s)))

    def names(self) -> tuple[str, ...]:
        """The entry names, sorted."""
        return tuple(self.entries)


def _checked_entries(entries: Mapping[str, bytes], where: str,
                     max_entry_size: int) -> dict[str, bytes]:
    """A snapshot of `entries`, after checking every name and value the way the reader will."""
    if not isinstance(entries, Mapping):
        raise bad_entry(where, "entries must be a mapping of name to bytes, "
                               f"not {type(entries).__name__}")
    checked = dict(entries.items())
    for name, data in checked.items():
        problem = "reserved for the index" if name == INDEX_NAME else name_problem(name)
        if problem:
            raise bad_entry_name(where, name, problem)
        if isinstance(data, memoryview) and data.readonly and data.contiguous and data.itemsize == 1:
            # an entry read back from a bundle (stored entries are views of the mapped file)
            data = checked[name] = data if is_stored(name) else data.tobytes()
        elif not isinstance(data, bytes):
            raise bad_entry(where, f"entry {shown(name)} must be bytes, not {type(data).__name__}")
        if len(data) > max_entry_size:
            raise bad_entry(where, f"entry {shown(name)} is {len(data)} bytes, over the cap of "
                                   f"{max_entry_size}")
    conflict = name_conflict([INDEX_NAME, *checked])
    if conflict:
        raise bad_entry(where, f"entry {shown(conflict[0])} cannot also be a directory "
                               f"(of {shown(conflict[1])})")
    return checked


def bundle_digest_of(entries: Mapping[str, bytes]) -> str:
    """The digest `write_bundle(path, entries)` returns, without compressing or writing anything."""
    checked = _checked_entries(entries, "cannot digest bundle entries", ustar.MAX_SIZE)
    return digest_of_index(index_bytes(checked))


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable. Some platforms and file systems cannot open or fsync a
    # directory; the bundle is complete either way, only the rename's durability is at stake.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    # Readers (xgrun, a parallel build, Bazel) must see the old bundle or the complete new one, never
    # a prefix. So: write a temp file in the same directory (os.replace is atomic only within one
    # file system), fsync it (else after a crash the rename can reach the disk before the bytes, and
    # the final name holds an empty file), then rename it over the target.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_BINARY
    while True:
        temp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            # Mode 0o644 less the umask, as for any new file (mkstemp would force 0o600).
            fd = os.open(temp, flags, 0o644)
            break
        except FileExistsError:
            continue
    try:
        with open(fd, "wb", closefd=True) as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def bundle_bytes(entries: Mapping[str, bytes], *, where: str = "cannot write engine",
                 max_total_size: int = DEFAULT_MAX_TOTAL_SIZE,
                 max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE) -> tuple[bytes, str]:
    """(the sealed bundle's bytes, its digest): what `write_bundle` writes, a pure function of
    `entries` for a given zstd library version."""
    checked = _checked_entries(entries, where, min(max_entry_size, ustar.MAX_SIZE))
    index = index_bytes(checked)
    if len(index) > max_entry_size:
        raise bad_entry(where, f"its index would be {len(index)} bytes, over the cap of "
                               f"{max_entry_size}")
    stored = [name for name in sorted(checked) if is_stored(name)]
    stream = ustar.encode([(INDEX_NAME, index), *((name, checked[name]) for name in sorted(checked)
                                                  if not is_stored(name))])
    total = len(stream) + sum(len(checked[name]) for name in stored)
    if total > max_total_size:
        raise bad_entry(where, f"the archive would be {total} bytes uncompressed, over the "
                               f"cap of {max_total_size}")
    for name in stored:
        if len(checked[name]) > frame.MAX_STORED_SIZE:
            raise bad_entry(where, f"entry {shown(name)} is {len(checked[name])} bytes, over the "
                                   f"{frame.MAX_STORED_SIZE} a stored entry holds")
    digest = digest_of_index(index)
    compressed = frame.compress(stream)
    parts, heads, offset = [compressed], [], len(compressed)
    for name in stored:
        head = frame.stored_header(name, len(checked[name]), offset)
        parts += (head, checked[name])
        heads.append(head)
        offset += len(head) + len(checked[name])
    parts.append(frame.seal(compressed, digest, heads))
    return b"".join(parts), digest


def write_bundle(path: Path, entries: Mapping[str, bytes], *,
                 max_total_size: int = DEFAULT_MAX_TOTAL_SIZE,
                 max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE, trailer: bytes | None = None) -> str:
    """Write `entries` as an engine bundle at `path`, atomically; return the bundle digest.

    Names follow `digest.name_problem`; values are bytes. The caps are the reader's defaults, so a
    bundle written with them reads back with them. `trailer`: a trailer body (`signing.py`) to
    write after the seal. Raises `BundleEntryError` for entries that cannot go in a bundle and
    `OSError` when the file cannot be written (no temp file is left behind).
    """
    path = Path(path)
    data, digest = bundle_bytes(entries, where=f"cannot write engine {path}",
                                max_total_size=max_total_size, max_entry_size=max_entry_size)
    atomic_write(path, data + (frame.trailer_frame(trailer) if trailer is not None else b""))
    return digest


def _read_file(path: Path, where: str, limit: int, mapped: bool = False) -> bytes | memoryview:
    """The bytes of the regular file at `path` (at most `limit`); with `mapped`, a read-only view
    of the file mapped into memory (pages are read as they are touched)."""
    # O_NONBLOCK so that a FIFO at `path` is refused below instead of blocking the open.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _O_CLOEXEC | _O_BINARY
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise unreadable(where, "does not exist") from None
    except OSError as err:
        # A socket cannot be opened at all (ENXIO): say what it is rather than the errno.
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                raise unreadable(where, "is not a regular file (a socket)") from None
        raise unreadable(where, f"cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise unreadable(where, "is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise unreadable(where, "is not a regular file")
        if info.st_size > limit:
            raise too_large(where, f"the file is {info.st_size} bytes, over the {limit} that the "
                                   "caps allow")
        if mapped and info.st_size:
            return memoryview(mmap.mmap(fd, info.st_size, access=mmap.ACCESS_READ))
        with open(fd, "rb", closefd=False) as source:
            # read(n) allocates n bytes up front: ask for the size fstat gave, not for the cap.
            data = source.read(info.st_size)
            grew = source.read(1)
    except OSError as err:
        raise unreadable(where, f"cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)
    if grew:
        raise unreadable(where, "changed size while it was being read")
    return data


def _unpack(reader: frame.FrameReader, where: str, max_entry_size: int,
            stored: Mapping[str, memoryview]) -> tuple[bytes, dict[str, tuple[str, int]], dict[str, bytes]]:
    """(index bytes, its listing, other entries) of a tar stream laid out as the writer lays it out,
    `stored`: the entries stored outside it, which it must not hold.

    Once the index is read, every other header must name an entry it lists, in order, with the
    size it lists, before that entry's data is read: memory follows what the index declares.
    """
    index: bytes | None = None
    listing: dict[str, tuple[str, int]] = {}
    entries: dict[str, bytes] = {}
    previous = ""

    def admit(name: str, size: int) -> None:
        if index is None:
            if name != INDEX_NAME:
                raise bad_layout(where, f"its first entry is {shown(name)}, not the index {INDEX_NAME}")
            if size > MAX_INDEX_SIZE:
                raise too_large(where, f"its index is {size} bytes, over the cap of {MAX_INDEX_SIZE}")
            return
        if name in entries or name == INDEX_NAME:
            raise bad_layout(where, f"entry {shown(name)} appears twice")
        if name < previous:
            raise bad_layout(where, f"entry {shown(name)} comes after {shown(previous)}; "
                                    "XG writes entries in sorted order")
        if name not in listing:
            raise corrupt(where, f"entry {shown(name)} is not in the index")
        if name in stored:      # (tensor data inside the frame is how XG wrote it before: read)
            raise bad_layout(where, f"entry {shown(name)} is both in the zstd frame and stored after it")
        if size != listing[name][1]:
            raise corrupt(where, f"entry {shown(name)} is {size} bytes but the index says "
                                 f"{listing[name][1]}")

    for name, data in ustar.read_members(reader, where, max_entry_size=max_entry_size,
                                         name_problem=name_problem, admit=admit):
        if index is None:
            index, parsed = data, listing_of(data)
            if isinstance(parsed, str):
                raise BundleFormatError(f"{where} has an index ({INDEX_NAME}) XG cannot use: {parsed}")
            listing = parsed
            continue
        entries[name] = data
        previous = name
    if index is None:
        raise bad_layout(where, f"it holds no entries, not even the index {INDEX_NAME}")
    reader.finish()
    conflict = name_conflict([INDEX_NAME, *entries])
    if conflict:
        raise bad_layout(where, f"entry {shown(conflict[0])} is also a directory "
                                f"(of {shown(conflict[1])})")
    return index, listing, entries


def _distinct(a: str, b: str) -> tuple[str, str]:
    """Prefixes of two different digests long enough to tell them apart (at least 16 digits)."""
    differ = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    cut = max(16, differ + 8)
    return (a if cut >= len(a) else a[:cut] + "…"), (b if cut >= len(b) else b[:cut] + "…")


def _file_limit(max_total_size: int) -> int:
    # zstd's worst case is 3 bytes per 128 KiB block plus the header and checksum: 1/256 is ample.
    # A trailer's room scales with the cap, so a small cap still bounds the whole file.
    trailer = min(frame.MAX_TRAILER_BODY, max_total_size >> 4) + 64
    return max_total_size + (max_total_size >> 8) + 1024 + frame.SEAL_SIZE + trailer


def read_bundle_file(path: Path, *, max_total_size: int = DEFAULT_MAX_TOTAL_SIZE) -> bytes:
    """The bytes of the file at `path`, read as `read_bundle` reads it (a regular file within the
    caps), for a caller that must keep the bytes it verified (`xgbuild sign` rewrites them)."""
    path = Path(path)
    return _read_file(path, f"engine {path}", _file_limit(max_total_size))


def bundle_from_bytes(data: bytes, where: str, *, max_total_size: int = DEFAULT_MAX_TOTAL_SIZE,
                      max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE, max_ratio: int = DEFAULT_MAX_RATIO) -> Bundle:
    """`read_bundle` of bytes already read; `where` names them in errors ("engine PATH")."""
    sealed, trailer = frame.split_trailer(data, where)
    compressed, sealed_digest, stored = frame.unseal(sealed, where)
    sealed_size = len(sealed)
    reader = frame.open_frame(compressed, where, max_total_size)
    ratio_cap = max(RATIO_FLOOR, max_ratio * len(compressed))
    if reader.size > ratio_cap:
        raise too_large(where, f"it declares {reader.size} uncompressed bytes from "
                               f"{len(compressed)} compressed, over {max_ratio} times as many "
                               "(refused as a decompression bomb; read_bundle's max_ratio "
                               "raises the cap)")
    total = reader.size + sum(len(v) for v in stored.values())
    if total > max_total_size:
        raise too_large(where, f"its entries are {total} bytes in all, over the cap of {max_total_size}")
    index, listing, entries = _unpack(reader, where, max_entry_size, stored)
    del sealed, compressed, reader
    sha256s = {}
    for name, data in stored.items():
        problem = name_problem(name) or (None if is_stored(name) else "not tensor data (*.safetensors)")
        if problem:
            raise bad_layout(where, f"stored entry {shown(name)} cannot be stored: {problem}")
        if name not in listing:
            raise corrupt(where, f"stored entry {shown(name)} is not in the index")
        if len(data) != listing[name][1]:
            raise corrupt(where, f"stored entry {shown(name)} is {len(data)} bytes but the index says "
                                 f"{listing[name][1]}")
        if len(data) > max_entry_size:
            raise too_large(where, f"stored entry {shown(name)} is {len(data)} bytes, over the cap "
                                   f"of {max_entry_size}")
        sha256s[name] = hashlib.sha256(data).hexdigest()
        entries[name] = data
    entries = dict(sorted(entries.items()))
    if index != index_bytes(entries, sha256s):
        raise index_mismatch(index, entries, where)
    digest = digest_of_index(index)
    if digest != sealed_digest:
        recorded, actual = _distinct(sealed_digest, digest)
        raise corrupt(where, f"its seal records digest {recorded} but its contents have {actual}")
    return Bundle(digest, entries, MappingProxyType({name: listing[name][0] for name in entries}),
                  trailer, sealed_size)


def read_bundle(path: Path, *, max_total_size: int = DEFAULT_MAX_TOTAL_SIZE,
                max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE,
                max_ratio: int = DEFAULT_MAX_RATIO) -> Bundle:
    """Read and verify the engine bundle at `path`; raise a `BundleError` unless all of it is sound.

    `max_total_size` caps the uncompressed tar stream and `max_entry_size` each entry; past
    `RATIO_FLOOR` bytes, the stream may be at most `max_ratio` times the compressed frame (real
    engines, cubins, JSON and float weights, compress 1-20 times; a bomb, thousands). All three
    are checked against declared sizes before any of it is decompressed, and each entry's header
    against the index before its data is: peak memory is about the file plus the entries. A
    trailer (signatures, provenance) is split off and its layout checked; its body is returned
    unparsed (`Bundle.trailer`).
    """
    path = Path(path)
    data = _read_file(path, f"engine {path}", _file_limit(max_total_size), mapped=True)
    return bundle_from_bytes(data, f"engine {path}", max_total_size=max_total_size,
                             max_entry_size=max_entry_size, max_ratio=max_ratio)
