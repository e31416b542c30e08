"""The store interface that the local and remote tiers both implement.

Two namespaces, named as in the Bazel HTTP cache protocol: `cas` holds blobs addressed by the
sha256 of their content, `ac` holds records addressed by a cache key's digest. Names are always
64 lowercase hex characters (checked by `digests.check_digest` before use). A store verifies what
it returns: `get` gives back bytes that hash to their name (cas) or decode to a record whose key
parts hash to their name (ac), or None.
"""

from __future__ import annotations

from typing import Literal, Protocol

from xgbuild.cache.errors import CacheError, shorten

Kind = Literal["cas", "ac"]
KINDS: tuple[Kind, ...] = ("cas", "ac")


def check_kind(kind: object) -> Kind:
    if kind not in KINDS:
        raise CacheError(f"unknown store namespace {shorten(kind)}: expected 'cas' or 'ac'")
    return kind  # type: ignore[return-value]


class Store(Protocol):
    """get / put / contains over the `cas` and `ac` namespaces."""

    def get(self, kind: Kind, name: str) -> bytes | None: ...

    def put(self, kind: Kind, name: str, data: bytes) -> None: ...

    def contains(self, kind: Kind, name: str) -> bool: ...
