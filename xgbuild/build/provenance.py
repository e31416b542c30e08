"""Provenance at build time and after: the statement an engine carries, signed or not.

`build_envelope` makes the envelope of an engine just built (`xgc --sign-key`, `--provenance`),
with what the build knows: its parameters and where each cache record it linked came from.
`sign_file` signs an engine already written (`xgbuild sign`): it keeps the engine's statement
when it has one, else makes one from the manifest, adds the signature and rewrites the file's
trailer only; the bundle's bytes and digest stay as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import zstandard

from ..errors import EngineError
from ..packager import provenance
from ..packager.archive import atomic_write
from ..packager.engine_file import EngineFile, read_engine_sealed
from ..packager.frame import trailer_frame
from ..packager.signing import Envelope, SigningError, load_private_key, new_envelope
from ..settings import Settings


def build_envelope(file: EngineFile, *, name: str, parameters: Mapping[str, Any], settings: Settings,
                   origins: Any = None, key_path: Path | None = None) -> Envelope:
    """The provenance envelope of an engine built here; signed with the key at `key_path` if given."""
    key = load_private_key(key_path) if key_path is not None else None   # a bad key fails before anything
    records = provenance.cache_records(file.manifest, getattr(origins, "lookups", None),
                                       getattr(origins, "cubins", None), bool(getattr(origins, "linked", False)))
    statement = provenance.statement(digest=file.digest, name=name, manifest=file.manifest,
                                     parameters=parameters, builder_id=settings.builder_id, made_by="xgc",
                                     records=records, zstd_version=_zstd_version())
    envelope = new_envelope(statement)
    return envelope.signed(key) if key is not None else envelope


def _zstd_version() -> str:
    return ".".join(str(part) for part in zstandard.ZSTD_VERSION)


def sign_file(path: Path, key_path: Path, settings: Settings, out: Path | None = None) -> tuple[str, str, bool]:
    """Sign the engine at `path` with the key at `key_path`, writing `out` (default: `path`,
    replaced atomically). (bundle digest, key id, whether a statement had to be made)."""
    from ..packager.signing import key_id
    key = load_private_key(key_path)
    where = f"engine {path}"
    file, sealed = read_engine_sealed(path)
    made = file.envelope is None
    if made:
        manifest = file.manifest
        records = provenance.cache_records(manifest, None, None, linked=False, recorded=False)
        statement = provenance.statement(digest=file.digest, name=(out or path).name, manifest=manifest,
                                         parameters=provenance.parameters_from_manifest(manifest),
                                         builder_id=settings.builder_id, made_by="xgbuild sign (from the manifest)",
                                         records=records, zstd_version=_zstd_version())
        envelope = new_envelope(statement)
    else:
        envelope = file.envelope
    try:
        signed = envelope.signed(key)
        trailer = trailer_frame(signed.to_bytes())
    except ValueError as exc:
        raise SigningError(f"cannot sign {where}: {exc}") from None
    target = out or path
    try:
        atomic_write(target, sealed + trailer)
    except OSError as exc:
        raise EngineError(f"cannot write engine {target}: {exc.strerror or exc}") from None
    return file.digest, key_id(key.public_key()), made
