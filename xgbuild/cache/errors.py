"""The cache's error classes: one base, `CacheError`, and one subclass per way things go wrong.

Each class names the section of docs/cache.md that explains it, so a message can always end with
a pointer a user can follow. Messages are one line, lowercase, with no final period, and never
echo an unbounded user string (see `shorten`).
"""

from __future__ import annotations

DOCS = "docs/cache.md"


def shorten(value: object, limit: int = 48) -> str:
    """`repr(value)`, cut to `limit` characters, so a 1 MB bad argument never floods a message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 5]}…{text[-4:]} ({len(text)} chars)"


class CacheError(Exception):
    """Anything the cache refuses or cannot do; the CLI prints it as one line and exits 1."""

    docs_section = "errors"

    @property
    def help(self) -> str:
        return f"see {DOCS}#{self.docs_section}"


class InvalidDigestError(CacheError, ValueError):
    """A key or digest is not 64 lowercase hex characters (refused before any path or URL)."""

    docs_section = "keys-and-digests"


class KeyPartError(CacheError, ValueError):
    """A cache-key part holds a value that has no canonical JSON form (a set, NaN, an object)."""

    docs_section = "keys-and-digests"


class CorruptEntryError(CacheError):
    """A stored blob or record failed verification; it has been dropped from the local store."""

    docs_section = "verification"


class RejectedDownloadError(CacheError):
    """The remote returned bytes that do not match the digest or key they were fetched under."""

    docs_section = "verification"


class StoreFullError(CacheError, OSError):
    """The local store's filesystem is full; nothing partial was left behind."""

    docs_section = "disk-full"


class ReadOnlyStoreError(CacheError):
    """The cache directory (or its index) cannot be written: it is read, nothing is recorded."""

    docs_section = "read-only-cache"


class MissingBlobsError(CacheError):
    """A record was put before the blobs it names (or a gc evicted them meanwhile)."""

    docs_section = "local-store"


class SchemaError(CacheError):
    """The local index was written by a newer (or unknown) version of XG."""

    docs_section = "local-store"


class RemoteConfigError(CacheError, ValueError):
    """The remote URL or auth header is malformed."""

    docs_section = "remote-cache"


class RemoteUnavailableError(CacheError):
    """The remote is down, hangs, refuses, or answers with an error; it is skipped for this run."""

    docs_section = "remote-failures"


class RemoteAuthError(CacheError):
    """The remote refused a request for lack of credentials (HTTP 401 or 403)."""

    docs_section = "authentication"


class AmbiguousKeyError(CacheError, ValueError):
    """A key prefix matches more than one stored record; the CLI lists them and exits 2."""

    docs_section = "explaining-a-miss"
