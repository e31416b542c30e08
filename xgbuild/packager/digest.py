"""Entry names, the index (`DIGESTS.json`) and the bundle digest of an `.xge`.

The index is the archive's first member, whatever the other names. It lists every other entry's
sha256 and size, as canonical JSON (keys sorted, no spaces, ASCII, one trailing newline):

    {"entries":{"kernels/k0.cubin":{"sha256":"<64 hex>","size":1234},...},"format":1}

The bundle digest is the sha256 of exactly those bytes. It commits to every entry's name, size and
contents and to nothing else: not compression, tar headers or file metadata, so the same entries have
the same digest even if a later zstd compresses them to other bytes.

Entry names are relative paths of `[A-Za-z0-9._/-]`, with no empty, `.` or `..` component, at most
255 characters, fitting a ustar header; no name is both a file and a directory (`a` and `a/b`).
"""

from __future__ import annotations

import hashlib
import json
import string
from typing import Iterable, Mapping

from xgbuild.packager import ustar
from xgbuild.packager.archive_errors import BundleCorruptError, BundleError, BundleFormatError, shown

INDEX_NAME = "DIGESTS.json"
INDEX_FORMAT = 1
MAX_NAME_LENGTH = 255
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "._/-")
_HEX = frozenset("0123456789abcdef")


def name_problem(name: object) -> str | None:
    """Why `name` cannot name an entry, as a short phrase, or None when it can."""
    if not isinstance(name, str):
        return f"of type {type(name).__name__}, not str"
    if not name:
        return "empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"longer than {MAX_NAME_LENGTH} characters"
    bad = next((c for c in name if c not in _NAME_CHARS), None)
    if bad is not None:
        return f"character {bad!r} is not in [A-Za-z0-9._/-]"
    if name.startswith("/"):
        return "an absolute path"
    parts = name.split("/")
    if "" in parts:
        return "an empty path component"
    if ".." in parts:
        return "a '..' path component"
    if "." in parts:
        return "a '.' path component"
    if ustar.split_name(name) is None:
        return "too long for a ustar header: over 100 characters with no '/' splitting it 155 + 100"
    return None


def name_conflict(names: Iterable[str]) -> tuple[str, str] | None:
    """A pair (file, path under it) when some name is also used as a directory, else None."""
    known = set(names)
    for name in sorted(known):
        for cut in (i for i, c in enumerate(name) if c == "/"):
            if name[:cut] in known:
                return name[:cut], name
    return None


def _canonical(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii") + b"\n"


def index_bytes(entries: Mapping[str, bytes], sha256s: Mapping[str, str] | None = None) -> bytes:
    """The canonical index listing `entries` (names already validated); `sha256s` gives the
    digests of entries already hashed (a large one is read once, not twice)."""
    known = sha256s or {}
    listing = {name: {"sha256": known.get(name) or hashlib.sha256(data).hexdigest(), "size": len(data)}
               for name, data in entries.items()}
    return _canonical({"entries": listing, "format": INDEX_FORMAT})


def digest_of_index(index: bytes) -> str:
    """The bundle digest: sha256 hex of the index's canonical bytes."""
    return hashlib.sha256(index).hexdigest()


def listing_of(raw: bytes) -> dict[str, tuple[str, int]] | str:
    """The index's entries as {name: (sha256, size)}, or why it is not an XG index."""
    try:
        document = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "it is not JSON"
    if not isinstance(document, dict) or set(document) != {"entries", "format"}:
        return "it does not hold exactly the keys 'entries' and 'format'"
    if document["format"] != INDEX_FORMAT or type(document["format"]) is not int:
        return (f"its format is {shown(document['format'])}; this XG reads format {INDEX_FORMAT}, "
                "so the engine may come from a newer XG")
    if not isinstance(document["entries"], dict):
        return "'entries' is not an object"
    listing: dict[str, tuple[str, int]] = {}
    for name, record in document["entries"].items():
        if not isinstance(record, dict) or set(record) != {"sha256", "size"}:
            return f"its record for {shown(name)} does not hold exactly 'sha256' and 'size'"
        sha, size = record["sha256"], record["size"]
        if not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= _HEX):
            return f"its sha256 for {shown(name)} is not 64 lowercase hex digits"
        if type(size) is not int or size < 0:
            return f"its size for {shown(name)} is not a non-negative integer"
        listing[name] = (sha, size)
    return listing


def _short(sha: str) -> str:
    return sha[:16] + "…"


def index_mismatch(raw: bytes, entries: Mapping[str, bytes], where: str) -> BundleError:
    """The error that says how the stored index `raw` differs from the index of `entries`.

    Called only once `raw != index_bytes(entries)`; the first difference found is reported.
    """
    listing = listing_of(raw)
    if isinstance(listing, str):
        return BundleFormatError(f"{where} has an index ({INDEX_NAME}) XG cannot use: {listing}")
    for name in sorted(entries):
        if name not in listing:
            return BundleCorruptError(f"{where} is corrupt: entry {shown(name)} is not in the index")
    for name in sorted(listing):
        if name not in entries:
            return BundleCorruptError(f"{where} is corrupt: the index lists {shown(name)} "
                                      "but the archive has no such entry")
    for name in sorted(entries):
        sha, size = listing[name]
        actual_size, actual_sha = len(entries[name]), hashlib.sha256(entries[name]).hexdigest()
        if actual_size != size:
            return BundleCorruptError(f"{where} is corrupt: entry {shown(name)} is {actual_size} "
                                      f"bytes but the index says {size}")
        if actual_sha != sha:
            return BundleCorruptError(f"{where} is corrupt: entry {shown(name)} has sha256 "
                                      f"{_short(actual_sha)} but the index says {_short(sha)}")
    return BundleFormatError(f"{where} has an index ({INDEX_NAME}) that is not in canonical form")
