"""Where the cache records a build linked came from: the local store or the remote tier.

The tuner keeps only "cache" for a winner it looked up; which tier served it is known to the
cache's `lookup` alone. `Recording` wraps the build's cache and notes the tier of each hit, by key
digest, and of each cubin it serves, by the cubin's sha256, for the engine's provenance
(`packager/provenance.py`). It changes no lookup: every call goes to the cache as it was.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Origins:
    """What the build saw: cache key digest -> "local" | "remote"; cubin sha256 -> the same;
    `linked`: kernels came from tune-shard result files (this process compiled and tuned none)."""
    lookups: dict[str, str] = field(default_factory=dict)
    cubins: dict[str, str] = field(default_factory=dict)
    linked: bool = False


class Recording:
    """A cache (`cache.Cache`) whose hits are noted in an `Origins`; everything else passes through."""

    def __init__(self, cache: Any, origins: Origins) -> None:
        self._cache = cache
        self._origins = origins

    def lookup(self, key: Any) -> Any:
        hit = self._cache.lookup(key)
        if hit is not None:
            digest = getattr(key, "digest", key)
            self._origins.lookups[str(digest)] = hit.source
            cubin = hit.blobs.get("cubin")
            if isinstance(cubin, bytes):
                self._origins.cubins[hashlib.sha256(cubin).hexdigest()] = hit.source
        return hit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)
