"""XG's public Python API, as the seed's README uses it.

    engine = xg.compile_file(Path("examples/cluster_matmul.xg"))
    result = xg.run_engine(engine, external_values={"A": a, "B": b})
    print(result.value); print(result.metadata)

The implementation lives in `xgbuild` (building in `xgbuild.build`); this module only re-exports,
and reads the settings from the environment at each call, handing them down. It imports torch
only when first used, so that `xg.runtime` (the deploy runtime's API) runs where torch is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from typing import TYPE_CHECKING

from xgbuild.errors import CompileError, EngineError, ExecutionError, InputError, XGError
from xgbuild.settings import RunSettings, Settings, child_env

if TYPE_CHECKING:
    from xgbuild.runtime.engine import Engine, ResultValue, RunResult
    from xgbuild.runtime.model_engine import LazyModelEngine, ModelEngine

_LAZY = {"Engine": "xgbuild.runtime.engine", "ResultValue": "xgbuild.runtime.engine",
         "RunResult": "xgbuild.runtime.engine", "LazyModelEngine": "xgbuild.runtime.model_engine",
         "ModelEngine": "xgbuild.runtime.model_engine"}


def __getattr__(name: str) -> Any:
    """The torch-backed classes, imported on first use (`xg.Engine`, `xg.RunResult`, ...)."""
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "runtime":
        import importlib
        return importlib.import_module("xg.runtime")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["CompileError", "Engine", "EngineError", "ExecutionError", "InputError", "LazyModelEngine", "ModelEngine",
           "ResultValue",
           "RunResult", "XGError", "compile", "compile_file", "load_engine", "load_model_engine", "run_engine"]


def __dir__() -> list[str]:
    """`dir(xg)` and tab completion show the public API (`__all__`), not the helpers imported here."""
    return sorted(__all__)


def compile_file(path: Path | str, *, target: str | None = None, num_gpu: int | None = None,
                 tune: str = "cache", kernels: bool = True, dims: Mapping[str, int] | None = None,
                 sharding: Path | str | None = None, entry: str = "main",
                 consts: Mapping[str, Any] | None = None) -> Engine:
    """Compile an `.xg` file into an engine (raises `CompileError` with rendered diagnostics).

    Like `xgc --out`: GPU kernels for the target are tuned under `tune` (measure | cache | predict |
    strict) at the sizes `dims` gives symbolic dims (1024 otherwise); `kernels=False` makes a
    CPU-only engine; `sharding` is a plan file, as `xgc --sharding`; `entry` names the function the
    engine runs (another than `main` takes the engine's inputs as its parameters); `consts`
    overrides file-level constants, as `xgc --const` (`{"L": 2, "D": 64}`: a small configuration
    of a model whose sizes are constants). The same source and winners give the same bytes as
    `xgc`."""
    from xgbuild.build import engines as _build
    from xgbuild.runtime.engine import Engine
    engine = _build.compile_file(path, Settings.from_env(), target=target, num_gpu=num_gpu, tune=tune,
                                 kernels=kernels, dims=dims, sharding=sharding, entry=entry, consts=consts)
    return Engine(engine.file, RunSettings.from_env())


def compile(model_or_fn: Any, example_inputs: Any = None, target: str = "H100", num_gpu: int = 1, *,
            example_kwargs: Mapping[str, Any] | None = None, dynamic_shapes: Any = None, tune: str = "cache",
            kernels: bool = True, dims: Mapping[str, int] | None = None,
            fallback: str | None = None) -> ModelEngine | LazyModelEngine:
    """Compile a PyTorch model (or function) into an engine called like it: `engine(x)`,
    `engine(input_ids=ids, attention_mask=mask)`.

    Captured with `torch.export` at `model(*example_inputs, **example_kwargs)`; `dynamic_shapes`
    as torch.export takes it, by parameter name (`{"input_ids": {0: Dim("batch")}}`) or in input
    order (`({0: torch.export.Dim("batch")},)`). Then XG's IR, the same passes, tuning (`tune`,
    `dims`), cache and packaging as `compile_file`. The engine's inputs are the tensors among
    those arguments, named as `forward`'s parameters; it binds positional arguments in
    `forward`'s order and keyword ones by name. Arguments that are not tensors (`use_cache=False`,
    `None`, `forward`'s defaults) are fixed at capture: a call may repeat them, with the same
    value only. `engine.save(path)` writes an `.xge` that `xgrun` runs; parameters and buffers
    travel inside it (a loaded engine binds positionals in its input order, keywords by name).
    An op XG cannot express is a `CompileError` listing each once, with its count and the modules
    that use it, or with `fallback="eager"` a warning listing them, and the engine calls each
    through PyTorch (`torch.ops`) between its kernels.

    Without `example_inputs` and `example_kwargs` (`engine = xg.compile(model, target="GB200")`),
    the engine is built at its first call from that call's arguments, and again for each new input
    signature."""
    from xgbuild.build import engines as _build
    return _build.compile_model(model_or_fn, example_inputs, target, num_gpu, Settings.from_env(),
                                RunSettings.from_env(), example_kwargs=example_kwargs, dynamic_shapes=dynamic_shapes,
                                tune=tune, kernels=kernels, dims=dims, fallback=fallback)


def load_model_engine(path: Path | str, *, trusted_keys: Path | str | None = None,
                      expect_digest: str | None = None, allow_fallback: bool = False) -> ModelEngine:
    """Load an engine built by `xg.compile` (or `xgc model.onnx`), called with tensors, positionally
    in its input order (`engine.signature`) or by input name. `trusted_keys`, `expect_digest` and
    `allow_fallback` as for `load_engine`."""
    from xgbuild.runtime.model_engine import ModelEngine
    return ModelEngine.load(path, RunSettings.from_env(), trusted_keys=trusted_keys, expect_digest=expect_digest,
                            allow_fallback=allow_fallback)


def load_engine(path: Path | str, *, trusted_keys: Path | str | None = None,
                expect_digest: str | None = None, allow_fallback: bool = False) -> Engine:
    """Load and verify an `.xge` engine file (raises `EngineError`). `trusted_keys` (default:
    XG_TRUSTED_KEYS): a directory of `.pub` keys, one of which must have signed the engine;
    `expect_digest`: the bundle digest it must have. `engine.trust` then holds the verdict
    (`trusted`, `signer`); `engine.check_trust(keys)` gives one for any keys. One built with
    `fallback="eager"` (it calls PyTorch operators) loads only with `allow_fallback=True` or when
    a trusted key signed it: opt in for files you trust."""
    from xgbuild.runtime.engine import Engine
    return Engine.load(path, RunSettings.from_env(), trusted_keys=trusted_keys, expect_digest=expect_digest,
                       allow_fallback=allow_fallback)


def run_engine(engine: Engine, external_values: Mapping[str, Any] | None = None, *, device: str = "cpu",
               check: bool = True, nproc: int = 1, wait: bool | None = None) -> RunResult:
    """Run an engine; `result.value` is what `main` returns, `result.metadata` how it ran.
    `nproc=N` runs its sharding plan on N ranks of this host, like `xgrun --nproc N`. On a GPU it
    returns once the run is queued: reading `result.value` waits for it and its check (`wait`:
    see `Engine.run`)."""
    from xgbuild.runtime.engine import Engine
    if not isinstance(engine, Engine):
        raise XGError(f"run_engine takes an Engine (from xg.compile_file or xg.load_engine), got {type(engine).__name__}")
    if not isinstance(nproc, int) or nproc < 1:
        raise XGError(f"nproc must be a positive integer, got {nproc!r}")
    if nproc > 1:
        from xgbuild.runtime.distributed import run_ranks
        return run_ranks(engine, external_values, nproc, child_env(), device=device, check=check)
    return engine.run(external_values, device=device, check=check, wait=wait)
