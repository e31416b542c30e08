"""Engine bundles: the manifest, the program IR and the sources, in one verified `.xge` archive.

`engine_entries` lays a compiled program out as archive entries; `read_engine` reads one back,
verifying (through the archive layer) every byte, then the format version, then that the program
and sources are the ones the manifest names. Nothing from the file is used before that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..compiler.ir.graph import Graph
from ..compiler.ir.serialize import loads
from ..compiler.ir.verify import IRError, verify
from ..errors import EngineError
from .archive import Bundle, BundleError, bundle_digest_of, read_bundle, write_bundle
from .manifest import FORMAT_VERSION, canonical_json, sha256
from .signing import Envelope, SigningError, parse_envelope


@dataclass(frozen=True)
class EngineFile:
    manifest: dict
    graph: Graph
    sources: dict[str, bytes]
    entries: dict[str, bytes]
    digest: str
    envelope: Envelope | None = None      # signatures and provenance from the trailer (signing.py)


def engine_entries(manifest: dict, program_blob: bytes, sources: dict[str, bytes],
                   files: dict[str, bytes] | None = None) -> dict[str, bytes]:
    entries = {"manifest.json": canonical_json(manifest), "program.json": program_blob}
    for name, data in sources.items():
        entries[f"sources/{name}"] = data
    entries.update(files or {})          # kernels/…: cubins and PTX; weights.safetensors (imported models)
    return entries


def make_engine_file(manifest: dict, graph: Graph, program_blob: bytes, sources: dict[str, bytes],
                     files: dict[str, bytes] | None = None) -> EngineFile:
    entries = engine_entries(manifest, program_blob, sources, files)
    return EngineFile(manifest, graph, sources, entries, bundle_digest_of(entries))


def save_engine_file(engine: EngineFile, path: Path, envelope: Envelope | None = None) -> str:
    """Write the engine (with `envelope`, or the one it carries, in its trailer); its digest."""
    envelope = envelope or engine.envelope
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_bundle(path, engine.entries, trailer=envelope.to_bytes() if envelope else None)
    except (BundleError, OSError) as exc:
        raise EngineError(f"cannot write engine {path}: {exc}") from None


def read_engine(path: Path) -> EngineFile:
    try:
        bundle = read_bundle(path)
    except BundleError as exc:
        raise EngineError(str(exc)) from None
    return engine_from_bundle(bundle, f"engine {path}")


def engine_from_bundle(bundle: Bundle, where: str) -> EngineFile:
    """The engine in a verified bundle (`read_engine` of bytes already read and verified)."""
    entries = dict(bundle.entries)
    try:
        envelope = parse_envelope(bundle.trailer, where) if bundle.trailer is not None else None
    except SigningError as exc:
        raise EngineError(str(exc)) from None
    raw = entries.get("manifest.json")
    if raw is None:
        raise EngineError(f"{where} has no manifest.json: it is not an XG engine")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise EngineError(f"{where}: manifest.json is not JSON ({exc})") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int):
        raise EngineError(f"{where}: manifest has no format_version")
    if version > FORMAT_VERSION:
        raise EngineError(f"{where} has format version {version}, newer than this XG reads ({FORMAT_VERSION}); "
                          "upgrade XG to run it")
    if version < FORMAT_VERSION:
        raise EngineError(f"{where} has format version {version}, older than this XG reads ({FORMAT_VERSION}); "
                          "rebuild it with xgc")
    try:
        program = manifest["program"]
        blob = entries[program["path"]]
        if sha256(blob) != program["sha256"]:
            raise EngineError(f"{where}: program.json does not match the digest in the manifest")
        for src in manifest["sources"]:
            if sha256(entries[src["path"]]) != src["sha256"]:
                raise EngineError(f"{where}: source {src['path']} does not match the digest in the manifest")
        for k in manifest.get("kernels", []):
            for v in k["variants"]:
                for what in ("cubin", "ptx"):
                    if sha256(entries[v[what]]) != v[f"{what}_sha256"]:
                        raise EngineError(f"{where}: {v[what]} does not match the digest in the manifest")
        weights = manifest.get("weights")
        if weights is not None and sha256(entries[weights["path"]]) != weights["sha256"]:
            raise EngineError(f"{where}: {weights['path']} does not match the digest in the manifest")
        graph = loads(blob)
        verify(graph)
        sources = {s["path"].split("/", 1)[1]: entries[s["path"]] for s in manifest["sources"]}
    except EngineError:
        raise
    except IRError as exc:
        raise EngineError(f"{where}: invalid program: {exc}") from None
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise EngineError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None
    return EngineFile(manifest, graph, sources, entries, bundle.digest, envelope)

