"""Records: what a cache key maps to — a JSON value plus named blobs — and their self-verifying bytes.

A record is stored (locally in the `actions` table, remotely under `ac/<key>`) as canonical JSON:

    {"blobs": {"cubin": {"digest": "<sha256>", "size": 1234}, ...},
     "check": "<sha256 of this object without 'check'>",
     "format": "xg-cache-record/1",
     "key": {"format": "xg-cache-key/1", "parts": {...}},
     "value": <any JSON>}

It carries its own key parts, so `explain` works on a record pulled from a remote, and it can be
checked without trusting whoever served it: the parts must hash to the key it was fetched under,
`check` must match the rest of the bytes, and every blob it names is hash-checked when fetched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from xgbuild.cache.canonical import JSONValue, dumps, freeze, thaw
from xgbuild.cache.digests import check_digest, sha256_bytes
from xgbuild.cache.errors import CacheError, CorruptEntryError, shorten
from xgbuild.cache.keys import CacheKey

RECORD_FORMAT = "xg-cache-record/1"
PREDICTED = "predicted"         # value["how"] of a record the cost model, not a measurement, chose
MAX_RECORD_BYTES = 16 << 20     # a record is metadata; anything larger belongs in a blob
_BLOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class BlobRef:
    """A blob a record names: its sha256 and its uncompressed size in bytes."""

    digest: str
    size: int

    def __post_init__(self) -> None:
        check_digest(self.digest, "blob digest")
        if type(self.size) is not int or self.size < 0:
            raise CacheError(f"blob size must be a non-negative int, got {shorten(self.size)}")


@dataclass(frozen=True)
class Record:
    """A key's cached result: a JSON `value` and blobs by name (e.g. `cubin`, `ptx`)."""

    key: CacheKey
    value: JSONValue
    blobs: Mapping[str, BlobRef]

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", freeze(self.value, "record value"))
        for name in self.blobs:
            check_blob_name(name)
        object.__setattr__(self, "blobs", MappingProxyType(dict(sorted(self.blobs.items()))))

    @property
    def digest(self) -> str:
        """The key this record is stored under."""
        return self.key.digest

    @property
    def predicted(self) -> bool:
        """A winner the cost model picked rather than measured (`value["how"] == "predicted"`).
        Kept in the local store only so that its key can be explained; `Cache.lookup` never
        serves it as a hit, never uploads it, and never lets it replace a stored record."""
        return isinstance(self.value, Mapping) and self.value.get("how") == PREDICTED

    def encode(self) -> bytes:
        body = {
            "blobs": {n: {"digest": b.digest, "size": b.size} for n, b in self.blobs.items()},
            "format": RECORD_FORMAT,
            "key": self.key.payload(),
            "value": thaw(self.value),
        }
        body["check"] = sha256_bytes(dumps(body))
        data = dumps(body)
        if len(data) > MAX_RECORD_BYTES:
            raise CacheError(
                f"record for key {self.digest} is {len(data)} bytes (limit {MAX_RECORD_BYTES}): "
                "put large data in blobs"
            )
        return data


def check_blob_name(name: object) -> str:
    if not isinstance(name, str) or not _BLOB_NAME.fullmatch(name):
        raise CacheError(
            f"invalid blob name {shorten(name)}: use 1-128 characters from A-Z a-z 0-9 . _ -"
        )
    return name


def decode_record(data: bytes, expected_key: str) -> Record:
    """Parse and verify stored record bytes; raises `CorruptEntryError` saying what is wrong."""
    check_digest(expected_key, "key")
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptEntryError(f"record {expected_key} is {len(data)} bytes, over the limit")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise CorruptEntryError(f"record {expected_key} is not valid JSON") from None
    if not isinstance(obj, dict) or obj.get("format") != RECORD_FORMAT:
        raise CorruptEntryError(f"record {expected_key} is not an {RECORD_FORMAT!r} record")
    check = obj.pop("check", None)
    if set(obj) != {"blobs", "format", "key", "value"}:
        raise CorruptEntryError(f"record {expected_key} has fields {sorted(obj)}")
    try:
        if check != sha256_bytes(dumps(obj)):
            raise CorruptEntryError(f"record {expected_key} fails its own checksum")
        key = CacheKey.from_payload(obj["key"])
        blobs = obj["blobs"]
        if not isinstance(blobs, dict):
            raise CorruptEntryError(f"record {expected_key} has a malformed blob table")
        refs = {}
        for name, ref in blobs.items():
            if not isinstance(ref, dict) or set(ref) != {"digest", "size"}:
                raise CorruptEntryError(f"record {expected_key} has a malformed entry for {name!r}")
            refs[name] = BlobRef(ref["digest"], ref["size"])
        record = Record(key, obj["value"], refs)
    except CorruptEntryError:
        raise
    except (CacheError, ValueError, TypeError) as exc:
        # KeyPartError, InvalidDigestError, a bad blob name: all mean the bytes are not a record.
        raise CorruptEntryError(f"record {expected_key} is malformed: {exc}") from None
    if key.digest != expected_key:
        raise CorruptEntryError(
            f"record stored under key {expected_key} holds key parts that hash to {key.digest}"
        )
    return record

