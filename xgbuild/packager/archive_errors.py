"""Errors of the `.xge` container, and the one-line messages they carry.

Every error names the engine file and what is wrong, in one line the CLI can print as is, e.g.
`engine build/e.xge is corrupt: entry 'kernels/k0.cubin' has sha256 ab12… but the index says cd34…`.
Errors from zstd, tarfile or json never escape: the container translates them into these.
"""

from __future__ import annotations


class BundleError(Exception):
    """An engine bundle could not be written or read."""


class BundleReadError(BundleError):
    """The file could not be read at all: missing, a directory, no permission."""


class BundleFormatError(BundleError):
    """Not an XG engine, or not laid out as XG writes one: not zstd, not ustar, a link, a bad name."""


class BundleCorruptError(BundleError):
    """An XG engine whose bytes were damaged: truncated, a zstd checksum, an entry against the index."""


class BundleTooLargeError(BundleError):
    """Reading would exceed a size cap: the guard against decompression bombs."""


class BundleEntryError(BundleError, ValueError):
    """`write_bundle` or `bundle_digest_of` was given entries that cannot go in a bundle."""


def shown(name: object) -> str:
    """A name as messages quote it."""
    # repr keeps the message on one line whatever the name holds (NUL, newline, backslash).
    text = repr(name)
    return text if len(text) <= 120 else text[:117] + "…"


def not_an_engine(where: str, detail: str) -> BundleFormatError:
    return BundleFormatError(f"{where} is not an XG engine ({detail})")


def bad_layout(where: str, detail: str) -> BundleFormatError:
    return BundleFormatError(f"{where} is not laid out as an XG engine: {detail}")


def bad_name(where: str, name: object, reason: str) -> BundleFormatError:
    return BundleFormatError(f"{where}: entry name {shown(name)} is not allowed ({reason})")


def bad_entry(where: str, detail: str) -> BundleEntryError:
    return BundleEntryError(f"{where}: {detail}")


def bad_entry_name(where: str, name: object, reason: str) -> BundleEntryError:
    return BundleEntryError(f"{where}: entry name {shown(name)} is not allowed ({reason})")


def corrupt(where: str, detail: str) -> BundleCorruptError:
    return BundleCorruptError(f"{where} is corrupt: {detail}")


def truncated(where: str, detail: str) -> BundleCorruptError:
    return BundleCorruptError(f"{where} is truncated ({detail})")


def too_large(where: str, detail: str) -> BundleTooLargeError:
    return BundleTooLargeError(f"{where} is too large to read: {detail}")


def unreadable(where: str, detail: str) -> BundleReadError:
    return BundleReadError(f"{where} {detail}")

