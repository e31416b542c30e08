"""Engine bundles: the manifest, the program IR and the sources, in one verified `.xge` archive.

`engine_entries` lays a compiled program out as archive entries; `read_engine` reads one back,
verifying (through the archive layer) every byte, then the format version, then that the program
and sources are the ones the manifest names. Nothing from the file is used before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..compiler.ir.graph import Graph
from ..compiler.ir.serialize import bounded_json, loads
from ..compiler.ir.verify import IRError, verify
from ..errors import EngineError
from .archive import (Bundle, BundleError, bundle_digest_of, bundle_from_bytes, read_bundle, read_bundle_file,
                      write_bundle)
from .manifest import FORMAT_VERSION, canonical_json, check_manifest
from .signing import Envelope, SigningError, parse_envelope
from .weights import check_weights


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
    """The verified engine at `path`; any way it is wrong is one `EngineError` line.

    In order, each step bounded by the one before: the bundle (every byte against its digest,
    within the size and ratio caps), the manifest (nesting and size capped before parsing), the
    entries it names against their digests (from the bundle's index: hashed once, whatever the
    manifest repeats), the program (capped the same way, then verified: dims, rank, node count),
    the manifest against the program, and the weights' header against the manifest.
    """
    try:
        bundle = read_bundle(path)
    except BundleError as exc:
        raise EngineError(str(exc)) from None
    return engine_from_bundle(bundle, f"engine {path}")


def read_engine_sealed(path: Path) -> tuple[EngineFile, bytes]:
    """`read_engine`, and the file's bytes up to the end of its seal (what a signature trailer
    follows): for a caller that rewrites the trailer or compares bytes (`xgbuild sign`, `verify
    --rebuild`), reading the file once."""
    where = f"engine {path}"
    try:
        data = read_bundle_file(path)
        bundle = bundle_from_bytes(data, where)
    except BundleError as exc:
        raise EngineError(str(exc)) from None
    return engine_from_bundle(bundle, where), bytes(data[:bundle.sealed_size])


def engine_from_bundle(bundle: Bundle, where: str) -> EngineFile:
    """The engine in a verified bundle (`read_engine` of bytes already read and verified)."""
    entries, hashes = dict(bundle.entries), bundle.sha256s
    try:
        envelope = parse_envelope(bundle.trailer, where) if bundle.trailer is not None else None
    except SigningError as exc:
        raise EngineError(str(exc)) from None
    raw = entries.get("manifest.json")
    if raw is None:
        raise EngineError(f"{where} has no manifest.json: it is not an XG engine")
    try:
        manifest = bounded_json(raw, "manifest.json")
    except ValueError as exc:
        raise EngineError(f"{where}: {exc}") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if type(version) is not int:
        raise EngineError(f"{where}: manifest has no format_version")
    if version > FORMAT_VERSION:
        raise EngineError(f"{where} has format version {version}, newer than this XG reads ({FORMAT_VERSION}); "
                          "upgrade XG to run it")
    if version < FORMAT_VERSION:
        raise EngineError(f"{where} has format version {version}, older than this XG reads ({FORMAT_VERSION}); "
                          "rebuild it with xgc")
    try:
        program = manifest["program"]
        if hashes[program["path"]] != program["sha256"]:
            raise EngineError(f"{where}: program.json does not match the digest in the manifest")
        for src in manifest["sources"]:
            if hashes[src["path"]] != src["sha256"]:
                raise EngineError(f"{where}: source {src['path']} does not match the digest in the manifest")
        for k in manifest.get("kernels", []):
            for v in k["variants"]:
                for what in ("cubin", "ptx"):
                    if hashes[v[what]] != v[f"{what}_sha256"]:
                        raise EngineError(f"{where}: {v[what]} does not match the digest in the manifest")
        weights = manifest.get("weights")
        if weights is not None and hashes[weights["path"]] != weights["sha256"]:
            raise EngineError(f"{where}: {weights['path']} does not match the digest in the manifest")
        graph = loads(entries[program["path"]])
        verify(graph)
        check_manifest(manifest, graph, set(entries), where)
        if weights is not None:
            check_weights(entries[weights["path"]], weights["tensors"], where)
        sources = {s["path"].split("/", 1)[1]: entries[s["path"]] for s in manifest["sources"]}
    except EngineError:
        raise
    except IRError as exc:
        raise EngineError(f"{where}: invalid program: {exc}") from None
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
        raise EngineError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None
    return EngineFile(manifest, graph, sources, entries, bundle.digest, envelope)

