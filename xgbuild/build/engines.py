"""The whole sequences, compile -> tune -> link -> package, that every front end runs: an `.xg`
program's engine (`xgc --out`, `xg.compile_file`) and an imported model's (`xgc MODEL.onnx`,
`xg.compile`). The front ends read the settings and the options; everything after is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..compiler.frontend import CheckOptions
from ..errors import XGError, user_stacklevel
from ..hw import GpuProfile, HardwareProfileError, UnknownTargetError
from ..runtime.engine import Engine
from ..settings import RunSettings, Settings
from ..tuner.policy import Policy
from .target import target_profile


@dataclass(frozen=True)
class Built:
    """An engine and what linking its kernels did (None: no kernels, a CPU-only engine), and
    where the cache records it linked came from (`origins.Origins`, for its provenance)."""
    engine: Engine
    stats: dict | None
    origins: Any = None


def link_engine(compiled: Any, settings: Settings, *, policy: Policy | str = Policy.CACHE,
                dims: Mapping[str, int] | None = None, kernels: bool = True, kernels_from: list[Path] | None = None,
                workers: int | None = None, progress: bool = False, early: Any = None) -> Built:
    """The engine of a compiled `.xg` program: kernels tuned and compiled for its target (or linked
    from `xgbuild tune-shard` results, `kernels_from`), then packaged. `early`: the GPUs and compile
    pool started before the front end ran (`context.early_start`)."""
    from .origins import Origins
    from .package import engine_of
    profile = target_profile(compiled.target, settings)
    dims = dict(dims or {})
    table = None
    origins = Origins(linked=bool(kernels_from))
    if kernels_from:
        from .shards import link_results
        table = link_results(compiled, profile, dims, list(kernels_from))
    elif kernels:
        from .kernels import kernels_for
        table = kernels_for(compiled, profile, policy, settings, dims, workers, progress, origins, early)
    return Built(engine_of(compiled, table, profile), table.stats if table is not None else None, origins)


def compile_file(path: Path | str, settings: Settings, *, target: str | None = None, num_gpu: int | None = None,
                 tune: Policy | str = Policy.CACHE, kernels: bool = True, dims: Mapping[str, int] | None = None,
                 sharding: Path | str | None = None, entry: str = "main",
                 consts: Mapping[str, Any] | None = None) -> Engine:
    """`xg.compile_file`: an `.xg` file's engine, as `xgc --out` builds it (the arguments checked
    first, each refusal an XGError naming it)."""
    from ..compiler.frontend.constants import OverrideError, normalize
    from ..compiler.frontend.checker import target_option_error
    from .compile import compile_program
    if num_gpu is not None and (not isinstance(num_gpu, int) or num_gpu < 1):
        raise XGError(f"num_gpu must be a positive integer, got {num_gpu!r}")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise XGError(f"entry must name a function, got {entry!r}")
    try:
        overrides = normalize(consts)
    except OverrideError as exc:
        raise XGError(str(exc)) from None
    bad_target = target_option_error(target, settings.hw_dir, "target=")
    if bad_target is not None:
        raise bad_target
    from .context import early_start
    options = CheckOptions(target=target, num_gpu=num_gpu, entry=entry, hw_dir=settings.hw_dir, consts=overrides)
    with early_start(tune, target, settings, kernels=kernels) as early:     # (overlaps the front end)
        compiled = compile_program(path, options, sharding)
        # `tune` goes to the tuner as given: it names a bad policy (and only when kernels are built).
        return link_engine(compiled, settings, policy=tune, dims=dims, kernels=kernels, early=early).engine


def model_target(target: str, settings: Settings) -> GpuProfile:
    """An imported model's target profile; an unknown name or a bad hw directory is an XGError."""
    try:
        return target_profile(target, settings)
    except (HardwareProfileError, UnknownTargetError) as exc:
        raise XGError(str(exc)) from None


def model_engine(imported: Any, profile: GpuProfile, settings: Settings, *, policy: Policy | str = Policy.CACHE,
                 kernels: bool = True, dims: Mapping[str, int] | None = None, progress: bool = False,
                 workers: int | None = None) -> Engine:
    """The engine of an imported program (PyTorch or ONNX): kernels for its target (unless
    `kernels=False`), tuned at `dims` (default: the sizes seen at capture) under `policy`, and its
    weights inside."""
    from .package import engine_of_graph
    table = None
    if kernels:
        from .kernels import kernels_for
        sizes = {**imported.example_dims, **dict(dims or {})}
        table = kernels_for(imported, profile, policy, settings, sizes, workers, progress)
    engine = engine_of_graph(imported.optimized.main, name=imported.name, source=imported.source, profile=profile,
                             num_gpu=imported.num_gpu, passes=imported.passes, kernels=table,
                             weights=imported.weights, ranges=imported.ranges)
    _warn_if_nothing_split(engine.manifest.get("sharding_plan"))
    return engine


def _warn_if_nothing_split(plan: dict | None) -> None:
    """A plan for several GPUs that splits no value copies every input whole to each GPU and
    computes the whole model on each: N times the work for one result. Say so rather than build
    it silently (an imported model carries no `shard(...)`, and the planner invents none)."""
    if not plan or plan["num_gpu"] < 2 or plan.get("pipeline") or plan["values"] or plan["collectives"]:
        return
    if any(layout != "R" for layout in plan["inputs"].values()):
        return
    import warnings
    n = plan["num_gpu"]
    warnings.warn(f"num_gpu={n}: the plan splits nothing: each of the {n} GPUs gets every input "
                  "whole and computes the whole model (nothing is sharded in a model imported from PyTorch or "
                  "ONNX); build with num_gpu=1 and run one engine per GPU, or write the model in XG with "
                  "`shard(...)` to split it", stacklevel=user_stacklevel())


def compile_model(model_or_fn: Any, example_inputs: Any, target: str, num_gpu: int, settings: Settings,
                  run_settings: RunSettings, *, example_kwargs: Mapping[str, Any] | None = None,
                  dynamic_shapes: Any = None, tune: Policy | str = Policy.CACHE, kernels: bool = True,
                  dims: Mapping[str, int] | None = None, fallback: str | None = None) -> Any:
    """`xg.compile`: a PyTorch model's `ModelEngine` (captured at `model(*example_inputs,
    **example_kwargs)`), or without either a `LazyModelEngine` that builds one per input signature
    at its calls. The target's profile is loaded once, here, for every engine built. An exception
    from XG's own code is an XG0900 internal error, one line."""
    from ..runtime.model_engine import LazyModelEngine, ModelEngine
    if fallback not in (None, "error", "eager"):
        raise XGError(f"fallback must be 'error' (the default: unsupported ops are a compile error) or 'eager' "
                      f"(they run in PyTorch), got {fallback!r}")
    if not isinstance(num_gpu, int) or isinstance(num_gpu, bool) or num_gpu < 1:
        raise XGError(f"num_gpu must be a positive integer, got {num_gpu!r}")
    profile = model_target(target, settings)

    def build(args: Any, kwargs: Any, shapes: Any = None) -> ModelEngine:
        from ..compiler.importers.imported import internal_error
        from ..compiler.importers.torch_export import import_torch
        imported = import_torch(model_or_fn, args, example_kwargs=kwargs, dynamic_shapes=shapes, target=profile.name,
                                num_gpu=num_gpu, fallback=fallback or "error", profile=profile)
        try:
            engine = model_engine(imported, profile, settings, policy=tune, kernels=kernels, dims=dims)
            return ModelEngine(Engine(engine.file, run_settings), out_spec=imported.out_spec, params=imported.params,
                               fixed=imported.fixed)
        except XGError:
            raise
        except Exception as bug:  # noqa: BLE001 (XG's own bug: one line naming it, never a traceback)
            raise internal_error("building the model's engine", bug) from None
    if example_inputs is None and example_kwargs is None:
        if dynamic_shapes is not None:
            raise XGError("dynamic_shapes needs example_inputs: pass example_inputs=(x,) with them")
        return LazyModelEngine(build)
    return build(example_inputs, example_kwargs, dynamic_shapes)
