"""`xgbuild verify --rebuild`: build an engine again from what it carries, and compare bytes.

An `.xg` engine carries its sources (`sources/`, the main file and any sharding plan), its target,
GPU count and, for every kernel, the winning config it was linked with. The rebuild compiles those
sources in a fresh temporary directory, plans the kernels' jobs, forces each job's recorded
winner (nothing is tuned, measured or looked up: the XG cache is not opened), compiles every
kernel here, packages the engine and compares the sealed bundle's bytes with the file's (its
trailer of signatures left out). A mismatch lists the entries that differ.

What it cannot see: `std` modules come from this XG (the engine records XG's version, not their
text), and an engine from `xg.compile` or `xgc MODEL.onnx` carries weights, not an `.xg` source,
so it cannot be rebuilt this way (a clear refusal).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..compiler.frontend import CheckOptions
from ..errors import CompileError, XGError
from ..packager.archive import bundle_bytes
from ..packager.engine_file import EngineFile, read_engine_sealed
from ..settings import Settings


class RebuildError(XGError):
    """The engine cannot be rebuilt from what it carries (not a mismatch: the rebuild could not run)."""


@dataclass(frozen=True)
class Rebuilt:
    """The outcome: `same` when the rebuilt bundle's bytes equal the file's."""
    digest: str
    rebuilt_digest: str
    same: bool
    differences: list[str] = field(default_factory=list)


def _parameters(file: EngineFile) -> Mapping[str, Any]:
    """How the engine says it was built (its provenance statement, if any): hints only. The byte
    comparison is the verification, so a forged hint can only make the rebuild fail."""
    if file.envelope is None:
        return {}
    params = file.envelope.statement().get("predicate", {}).get("buildDefinition", {}).get("externalParameters")
    return params if isinstance(params, dict) else {}


def _write_sources(file: EngineFile, where: str, tmp: Path) -> tuple[Path, Path | None]:
    """The engine's sources written under `tmp`: (main .xg file, sharding plan or None)."""
    mains = sorted(n for n in file.sources if n.endswith(".xg"))
    plans = sorted(n for n in file.sources if n.endswith(".toml"))
    if len(mains) != 1 or len(plans) > 1:
        raise RebuildError(f"{where} carries sources {sorted(file.sources)}; a rebuild needs one .xg file "
                           "(and at most one sharding plan)")
    for name, data in file.sources.items():
        # Entry names were checked by the archive reader: relative, no '.' or '..' components.
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return tmp / mains[0], (tmp / plans[0]) if plans else None


def _forced_kernels(compiled: Any, profile: Any, manifest: Mapping[str, Any], dims: Mapping[str, int],
                    workers: int | None, where: str) -> Any:
    """The kernel table with each job's winner taken from the manifest, every kernel compiled here."""
    from ..tuner.link import assemble, compile_winners, new_compiler, plan_jobs
    from ..tuner.policy import Policy
    from ..tuner.tuner import Tuner, Winner
    jobs, launches = plan_jobs(compiled.optimized.main, dict(dims), compiled.num_gpu)
    try:
        recorded = {k["id"]: k["tuning"] for k in manifest["kernels"]}
        idents = {job.ident for job in jobs}
        missing, extra = sorted(idents - set(recorded)), sorted(set(recorded) - idents)
        if missing or extra:
            raise RebuildError(f"{where} does not rebuild: its sources give {len(jobs)} kernel jobs, {len(missing)} "
                               f"of them not in the engine's kernel table, which has {len(extra)} others (first: "
                               f"{(missing or extra)[0]}): its sources and its kernels disagree (were they tuned "
                               "at other sizes? pass them with --dim NAME=SIZE)")
        keyer = Tuner(profile, policy=Policy.PREDICT)     # only for each job's cache key
        winners = {}
        for job in jobs:
            t = recorded[job.ident]
            winners[job.ident] = Winner({str(k): int(v) for k, v in dict(t["config"]).items()}, str(t["source"]),
                                        float(t["ms"]), keyer.key(job).digest, int(t.get("candidates", 0)),
                                        measured_on=t.get("measured_on"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RebuildError(f"{where}: its kernel table is malformed ({type(exc).__name__}: {exc})") from None
    compiler = new_compiler(profile, None, workers)     # no cache: every cubin is compiled here
    try:
        entries, files = compile_winners(jobs, winners, compiler)
    finally:
        compiler.close()
    return assemble(jobs, launches, entries, files)


def _manifest_keys(a: bytes, b: bytes) -> str:
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return ""
    keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
    if keys == ["kernels"] and _without_keys(x) == _without_keys(y):
        return (" (only the kernels' cache keys differ: this XG's toolchain fingerprint, a hash of its own "
                "sources, is not the builder's)")
    return f" (in {', '.join(keys)})" if keys else ""


def _without_keys(manifest: dict) -> object:
    try:
        return [{**k, "tuning": {**k["tuning"], "key": None}} for k in manifest["kernels"]]
    except (KeyError, TypeError):
        return None


def differences(original: Mapping[str, bytes], rebuilt: Mapping[str, bytes]) -> list[str]:
    """One line per entry that differs, is missing from the rebuild, or is new in it."""
    out = []
    for name in sorted(set(original) | set(rebuilt)):
        if name not in rebuilt:
            out.append(f"{name}: in the engine, not in the rebuild")
        elif name not in original:
            out.append(f"{name}: in the rebuild, not in the engine")
        elif original[name] != rebuilt[name]:
            a, b = (hashlib.sha256(original[name]).hexdigest()[:16], hashlib.sha256(rebuilt[name]).hexdigest()[:16])
            extra = _manifest_keys(original[name], rebuilt[name]) if name == "manifest.json" else ""
            out.append(f"{name}: sha256 {a}… in the engine, {b}… rebuilt{extra}")
    return out


def rebuild(path: Path, settings: Settings, *, entry: str | None = None, dims: Mapping[str, int] | None = None,
            workers: int | None = None) -> Rebuilt:
    """Rebuild the engine at `path` from its sources and recorded winners, and compare bytes."""
    from .compile import compile_program
    from .package import engine_of
    from .target import target_profile
    where = f"engine {path}"
    file, sealed = read_engine_sealed(path)
    manifest = file.manifest
    if "weights" in manifest:
        raise RebuildError(f"{where} was built from an imported model (xg.compile or xgc MODEL.onnx): it carries "
                           "weights and no .xg source, so it cannot be rebuilt from its sources; pin its digest "
                           "(xgrun --expect-digest) or check its signature instead")
    params = _parameters(file)
    entry = entry or (params.get("entry") if isinstance(params.get("entry"), str) else None) or "main"
    if dims is None:
        hinted = params.get("dims")
        dims = {str(k): int(v) for k, v in hinted.items() if isinstance(v, int)} if isinstance(hinted, dict) else {}
    with_kernels = bool(manifest.get("kernels") or manifest.get("launches"))
    with tempfile.TemporaryDirectory(prefix="xg-rebuild-") as tmp:
        main, plan = _write_sources(file, where, Path(tmp))
        options = CheckOptions(target=manifest["target"], num_gpu=manifest["num_gpu"], entry=entry,
                               hw_dir=settings.hw_dir, consts=tuple(sorted(manifest.get("consts", {}).items())))
        try:
            compiled = compile_program(main, options, plan)
        except CompileError as exc:
            first = next((line for line in str(exc).splitlines() if line.strip()), "")
            raise RebuildError(f"{where}: its sources do not compile here: {first}") from None
        profile = target_profile(compiled.target, settings)
        table = _forced_kernels(compiled, profile, manifest, dims, workers, where) if with_kernels else None
        engine = engine_of(compiled, table, profile)
    again, digest = bundle_bytes(engine.file.entries)
    same = again == sealed
    diffs = [] if same else differences(file.entries, engine.file.entries)
    if not same and not diffs:
        diffs = ["every entry is the same, but the compressed bytes differ (another zstd library version "
                 "compressed it; the digests agree)"]
    return Rebuilt(file.digest, digest, same, diffs)
