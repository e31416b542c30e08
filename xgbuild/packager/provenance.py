"""An engine's provenance statement: in-toto Statement v1 with a SLSA-provenance-v1-shaped predicate.

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "train.xge", "digest": {"sha256": <bundle digest>}}],
     "predicateType": "https://slsa.dev/provenance/v1",
     "predicate": {
       "buildDefinition": {"buildType": BUILD_TYPE,
                           "externalParameters": {source, target, num_gpu, entry, dims, sharding, tune, kernels},
                           "internalParameters": {"toolchain": {xg, triton, zstd}},
                           "resolvedDependencies": [the sources, then the cache records linked]},
       "runDetails": {"builder": {"id": ..., "version": {"xg": ...}}, "metadata": {"madeBy": ...}}}}

Each cache record the build linked is a resolved dependency named `xg-cache:winner/<key>` (the
tuning winner) or `xg-cache:cubin/<entry>` (a compiled kernel), with an `origin` annotation:

    winner   measured (by this build) | local-cache | remote-cache | cache (tier not recorded,
             e.g. linked from `xgbuild tune-shard` results) | predicted (the cost model's pick)
    cubin    compiled (by this build) | local-cache | remote-cache | linked (from tune-shard
             results, compiled or cached by that step) | not-recorded (signed after the build)

Nothing here is trusted by itself: the statement is as good as the signature over it
(`signing.py`), and says what the builder that holds the key claims.
"""

from __future__ import annotations

from typing import Any, Mapping

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/xg-lang/xg/engine-build/v1"
WINNER_ORIGINS = ("measured", "local-cache", "remote-cache", "cache", "predicted")
CUBIN_ORIGINS = ("compiled", "local-cache", "remote-cache", "linked")


def winner_origin(tuning: Mapping[str, Any], lookups: Mapping[str, str] | None) -> str:
    """Where a kernel's winner came from: its manifest `tuning` record, refined by the cache tier
    the build saw it come from (`lookups`: key digest -> "local" | "remote"), when it saw it."""
    source = tuning.get("source")
    if source == "cache":
        tier = (lookups or {}).get(str(tuning.get("key")))
        return f"{tier}-cache" if tier in ("local", "remote") else "cache"
    return source if source in ("measured", "predicted") else "cache"


def cache_records(manifest: Mapping[str, Any], lookups: Mapping[str, str] | None,
                  cubins: Mapping[str, str] | None, linked: bool, recorded: bool = True) -> list[dict]:
    """The cache records the engine links, as resolved dependencies with their origin.
    `cubins`: sha256 of a cubin served by the cache -> its tier; `linked`: the kernels came from
    tune-shard result files, so this process compiled none of them; `recorded` False: made after
    the build, from the manifest alone, which does not say where cubins came from."""
    records = []
    for kernel in manifest.get("kernels", []):
        tuning = kernel["tuning"]
        note = {"kernel": kernel["name"], "origin": winner_origin(tuning, lookups), "config": tuning["config"]}
        if tuning.get("measured_on"):
            note["measured_on"] = tuning["measured_on"]
        records.append({"name": f"xg-cache:winner/{tuning['key']}", "digest": {"sha256": tuning["key"]},
                        "annotations": note})
        for variant in kernel["variants"]:
            sha = variant["cubin_sha256"]
            tier = (cubins or {}).get(sha)
            origin = (f"{tier}-cache" if tier in ("local", "remote") else "not-recorded" if not recorded
                      else "linked" if linked else "compiled")
            records.append({"name": f"xg-cache:cubin/{variant['cubin']}", "digest": {"sha256": sha},
                            "annotations": {"kernel": kernel["name"], "origin": origin}})
    return records


def statement(*, digest: str, name: str, manifest: Mapping[str, Any], parameters: Mapping[str, Any],
              builder_id: str, made_by: str, records: list[dict], zstd_version: str) -> dict:
    """The statement for the engine of bundle digest `digest` built from `manifest`."""
    sources = [{"name": s["path"], "digest": {"sha256": s["sha256"]}} for s in manifest["sources"]]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": dict(parameters),
                "internalParameters": {"toolchain": {**manifest["toolchain"], "zstd": zstd_version},
                                       "format_version": manifest["format_version"]},
                "resolvedDependencies": sources + records,
            },
            "runDetails": {
                "builder": {"id": builder_id, "version": {"xg": manifest["toolchain"]["xg"]}},
                "metadata": {"madeBy": made_by},
            },
        },
    }


def parameters_from_manifest(manifest: Mapping[str, Any]) -> dict:
    """What the manifest alone says of how an engine was built (`xgbuild sign` of an engine built
    without provenance): its main source, target and GPU count; the rest was not recorded."""
    names = [s["path"].split("/", 1)[1] for s in manifest["sources"]]
    xg = [n for n in names if n.endswith(".xg")]
    plan = [n for n in names if n.endswith(".toml")]
    return {"source": xg[0] if xg else None, "target": manifest["target"], "num_gpu": manifest["num_gpu"],
            "sharding": plan[0] if plan else None, "imported_model": "weights" in manifest}


def summary(statement_doc: Mapping[str, Any]) -> list[str]:
    """`xgbuild inspect`'s lines for a statement: builder, parameters, sources, origin counts."""
    pred = statement_doc.get("predicate", {})
    build = pred.get("buildDefinition", {}) if isinstance(pred, dict) else {}
    run = pred.get("runDetails", {}) if isinstance(pred, dict) else {}
    lines = [f"builder     {run.get('builder', {}).get('id', '?')} ({run.get('metadata', {}).get('madeBy', '?')})"]
    params = build.get("externalParameters", {})
    if isinstance(params, dict):
        lines.append("parameters  " + ", ".join(f"{k}={v}" for k, v in sorted(params.items()) if v is not None))
    deps = build.get("resolvedDependencies", [])
    deps = deps if isinstance(deps, list) else []
    counts: dict[str, dict[str, int]] = {}
    for dep in deps:
        if not isinstance(dep, dict):
            continue
        name = str(dep.get("name", ""))
        if name.startswith("xg-cache:"):
            kind = name.removeprefix("xg-cache:").split("/", 1)[0]
            origin = str((dep.get("annotations") or {}).get("origin", "?"))
            counts.setdefault(kind, {}).setdefault(origin, 0)
            counts[kind][origin] += 1
        else:
            lines.append(f"built from  {name} {str((dep.get('digest') or {}).get('sha256', '?'))[:16]}")
    for kind in sorted(counts):
        lines.append(f"{kind + 's':<11} " + ", ".join(f"{n} {o}" for o, n in sorted(counts[kind].items())))
    return lines
