"""Packaging: an engine from an optimised program, its kernel table and (imported models) its
weights. The manifest, the program blob and the kernel files go into one verified `EngineFile`;
the runtime's `Engine` wraps it. The bytes are a pure function of these inputs.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..compiler.ir.graph import Graph
from ..compiler.ir.serialize import dumps
from ..compiler.passes.shard import footprint, plan_of
from ..hw import GpuProfile
from ..packager.engine_file import make_engine_file
from ..packager.manifest import build_manifest
from ..packager.weights import PATH as WEIGHTS_PATH
from ..packager.weights import weights_blob
from ..runtime.engine import Engine
from .target import target_profile


def engine_of(compiled: Any, kernels: Any = None, profile: GpuProfile | None = None) -> Engine:
    """The engine of a compiled `.xg` program (`compiler.driver.Compiled`); `kernels` (a tuner
    `KernelTable`) adds GPU kernels for the target; `profile`: the target's, if loaded already."""
    shards = [{"function": s.function, "name": s.name, "dim": s.dim, "region": s.region}
              for s in compiled.typed.shards]
    # A --sharding plan file travels with the engine's sources.
    extra = {compiled.plan.name: compiled.plan.text} if compiled.plan is not None else {}
    return engine_of_graph(compiled.optimized.main, name=compiled.name, source=compiled.source,
                           profile=profile or target_profile(compiled.target), num_gpu=compiled.num_gpu,
                           passes=compiled.passes, shards=shards, kernels=kernels, extra_sources=extra,
                           consts=dict(compiled.typed.consts), state=compiled.typed.state)


def engine_of_graph(graph: Graph, *, name: str, source: str, profile: GpuProfile, num_gpu: int, passes: Any,
                    shards: list[dict] | None = None, kernels: Any = None,
                    weights: Mapping[str, torch.Tensor] | None = None,
                    ranges: Mapping[str, tuple[int, int]] | None = None,
                    extra_sources: Mapping[str, bytes] | None = None, consts: Mapping[str, Any] | None = None,
                    state: Any = None) -> Engine:
    """An engine of an optimised graph. `weights` bind some of its INPUTs inside the engine (an
    imported model's parameters); `ranges` bound integer inputs used as indices; `consts`: the
    `--const` overrides the source was compiled with; `state`: the training state's pairs and
    counters (frontend/state.py)."""
    sources = {name: source.encode(), **dict(extra_sources or {})}
    blob = dumps(graph)
    plan = None
    if num_gpu > 1:
        plan = {**plan_of(graph, num_gpu, profile), "footprint": footprint(graph, num_gpu)}
    files = dict(kernels.files) if kernels else {}
    weights_entry = None
    if weights:
        wblob, weights_entry = weights_blob(dict(weights))
        files[WEIGHTS_PATH] = wblob
    manifest = build_manifest(graph=graph, program_blob=blob, profile=profile, num_gpu=num_gpu,
                              sources=sources, passes=list(passes), shards=list(shards or []), plan=plan,
                              kernels=kernels.kernels if kernels else None,
                              launches=kernels.launches if kernels else None, weights=weights_entry,
                              ranges={k: list(v) for k, v in (ranges or {}).items()}, consts=consts,
                              state=state)
    return Engine(make_engine_file(manifest, graph, blob, sources, files or None))
