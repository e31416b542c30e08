"""Digest validation and hashing: the gate every key and blob name passes before it touches a path.

A digest (a blob's sha256) and a key (a record's sha256) share one form: exactly 64 lowercase hex
characters. `check_digest` is called at the top of every store method, *before* any path or URL
is built from the value, so `../../etc/passwd`, an empty string, upper case or a 1 MB string can
never name a file or a request.
"""

from __future__ import annotations

import hashlib
import re
from typing import BinaryIO

from xgbuild.cache.errors import InvalidDigestError, shorten

DIGEST_LEN = 64
_HEX64 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


def is_digest(value: object) -> bool:
    # The length test comes first so a huge string costs nothing to refuse.
    return isinstance(value, str) and len(value) == DIGEST_LEN and _HEX64.fullmatch(value) is not None


def check_digest(value: object, what: str = "digest") -> str:
    """Return `value` if it is 64 lowercase hex characters, else raise `InvalidDigestError`."""
    if is_digest(value):
        return value  # type: ignore[return-value]
    if not isinstance(value, str):
        reason = f"must be a string, not {type(value).__name__}"
    elif len(value) != DIGEST_LEN:
        reason = f"must be {DIGEST_LEN} hex characters, got {len(value)}"
    elif value.lower() != value:
        reason = "must be lowercase hex"
    else:
        reason = "must contain only the characters 0-9 and a-f"
    raise InvalidDigestError(f"invalid {what} {shorten(value)}: {reason}")


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> tuple[str, int]:
    """Hash a binary stream to its end; returns (hex digest, byte count)."""
    h = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size
