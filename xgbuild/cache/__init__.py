"""Content-addressed artifact cache: keys, local store, remote HTTP tier, gc, explain.

The tuner builds a `CacheKey` from named parts, opens one `Cache` per process with
`Cache.open(settings)`, and calls `store(key, value, blobs)` / `lookup(key)`. See docs/cache.md.
"""

from xgbuild.cache.canonical import thaw
from xgbuild.cache.errors import (AmbiguousKeyError, CacheError, CorruptEntryError, InvalidDigestError, KeyPartError,
                                  MissingBlobsError, ReadOnlyStoreError, RejectedDownloadError, RemoteAuthError,
                                  RemoteConfigError, RemoteUnavailableError, SchemaError,
                                  StoreFullError)
from xgbuild.cache.fingerprint import toolchain_fingerprint
from xgbuild.cache.forensics import Neighbours, describe, miss_report, resolve_key
from xgbuild.cache.gc import GcReport, collect, parse_size
from xgbuild.cache.keys import CacheKey, PartDiff, diff_keys, explain
from xgbuild.cache.local import LocalStore, VerifyReport
from xgbuild.cache.records import BlobRef, Record
from xgbuild.cache.remote import RemoteStore
from xgbuild.cache.store import Store
from xgbuild.cache.tiered import Artifact, Cache

__all__ = [
    "AmbiguousKeyError", "Artifact", "BlobRef", "Cache", "CacheError", "CacheKey", "CorruptEntryError",
    "GcReport", "InvalidDigestError", "KeyPartError", "LocalStore", "MissingBlobsError", "Neighbours",
    "PartDiff", "ReadOnlyStoreError", "Record", "RejectedDownloadError", "RemoteAuthError", "RemoteConfigError", "RemoteStore",
    "RemoteUnavailableError", "SchemaError", "Store", "StoreFullError", "VerifyReport", "collect",
    "describe", "diff_keys", "explain", "miss_report", "parse_size", "resolve_key", "thaw",
    "toolchain_fingerprint",
]
