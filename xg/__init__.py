"""XG's public Python API, as the seed's README uses it.

    engine = xg.compile_file(Path("examples/cluster_matmul.xg"))
    result = xg.run_engine(engine, external_values={"A": a, "B": b})
    print(result.value); print(result.metadata)

The implementation lives in `xgbuild`; this module only re-exports and adapts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from xgbuild.compiler.driver import compile_file as _compile_file
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.errors import CompileError, EngineError, ExecutionError, InputError, XGError
from xgbuild.runtime.engine import Engine, ResultValue, RunResult

__all__ = ["CompileError", "Engine", "EngineError", "ExecutionError", "InputError", "ResultValue", "RunResult",
           "XGError", "compile_file", "load_engine", "run_engine"]


def compile_file(path: Path | str, *, target: str | None = None, num_gpu: int | None = None,
                 tune: str = "cache", kernels: bool = True, dims: Mapping[str, int] | None = None,
                 entry: str = "main") -> Engine:
    """Compile an `.xg` file into an engine (raises `CompileError` with rendered diagnostics).

    Like `xgc --out`: GPU kernels for the target are tuned under `tune` (measure | cache | predict |
    strict) at the sizes `dims` gives symbolic dims (1024 otherwise); `kernels=False` makes a
    CPU-only engine; `entry` names the function the engine runs (another than `main` takes the
    engine's inputs as its parameters). The same source and winners give the same bytes as `xgc`."""
    if num_gpu is not None and (not isinstance(num_gpu, int) or num_gpu < 1):
        raise XGError(f"num_gpu must be a positive integer, got {num_gpu!r}")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise XGError(f"entry must name a function, got {entry!r}")
    compiled = _compile_file(path, CheckOptions(target=target, num_gpu=num_gpu, entry=entry))
    table = None
    if kernels:
        from xgbuild.tuner.link import kernels_for
        table = kernels_for(compiled, tune, dict(dims or {}))
    return Engine.from_compiled(compiled, table)


def load_engine(path: Path | str) -> Engine:
    """Load and verify an `.xge` engine file (raises `EngineError`)."""
    return Engine.load(path)


def run_engine(engine: Engine, external_values: Mapping[str, Any] | None = None, *, device: str = "cpu",
               check: bool = True) -> RunResult:
    """Run an engine; `result.value` is what `main` returns, `result.metadata` how it ran."""
    if not isinstance(engine, Engine):
        raise XGError(f"run_engine takes an Engine (from xg.compile_file or xg.load_engine), got {type(engine).__name__}")
    return engine.run(external_values, device=device, check=check)
