"""The engine manifest: what an engine is, in one canonical JSON document.

Everything in it is a pure function of the sources, the options and the toolchain: no paths,
times, users or host names, so two builds of the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import triton

from .. import __version__
from ..compiler.ir.graph import Graph
from ..hw import GpuProfile

FORMAT_VERSION = 1


def canonical_json(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor_sig(graph: Graph, nid: int) -> dict:
    n = graph.node(nid)
    return {"dtype": n.dtype, "shape": list(n.shape)}


def _output_sig(graph: Graph, tree: dict) -> dict:
    if "t" in tree:
        return {"tensor": _tensor_sig(graph, tree["t"])}
    if "tuple" in tree:
        return {"tuple": [_output_sig(graph, t) for t in tree["tuple"]]}
    return {"result": _output_sig(graph, tree["result"]["value"])}


def build_manifest(*, graph: Graph, program_blob: bytes, profile: GpuProfile, num_gpu: int, sources: dict[str, bytes],
                   passes: list[str], shards: list[dict], kernels: list[dict] | None = None,
                   launches: list[dict] | None = None, plan: dict | None = None, weights: dict | None = None,
                   ranges: dict[str, list[int]] | None = None) -> dict:
    """`plan`: the SPMD plan of a many-GPU engine; `weights` (imported models): {"path", "sha256",
    "tensors": [{name, dtype, shape}]}, the INPUTs the engine binds itself, left out of the entry
    signature; `ranges`: [lo, hi) of integer inputs used as indices (checked before a run);
    `profile`: the target's, recorded whole so a deploy host needs no hw/ directory."""
    bound = {t["name"] for t in weights["tensors"]} if weights else set()
    ranges = ranges or {}
    inputs = [{"name": name, **_tensor_sig(graph, nid), **({"range": list(ranges[name])} if name in ranges else {})}
              for name, nid in graph.inputs if name not in bound]
    manifest = {
        "format_version": FORMAT_VERSION,
        "toolchain": {"xg": __version__, "triton": triton.__version__},
        "target": profile.name,
        "target_profile": profile.to_dict(),
        "num_gpu": num_gpu,
        "entry": {
            "inputs": inputs,
            "output": _output_sig(graph, graph.output),
        },
        "sharding": shards,
        "sharding_plan": plan,       # passes/shard.py's plan_of: layouts, collectives, bytes, footprint
        "kernels": kernels or [],
        "launches": launches or [],
        "program": {"path": "program.json", "sha256": sha256(program_blob), "passes": passes},
        "sources": [{"path": f"sources/{name}", "sha256": sha256(data)} for name, data in sorted(sources.items())],
    }
    if weights:
        manifest["weights"] = weights
    return manifest
