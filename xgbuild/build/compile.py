"""Compile, the build's first step: an `.xg` source and its `--sharding` plan file to the
optimised program (the compiler driver does the work). Light: no torch, no Triton.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..compiler.frontend import CheckOptions


def sharding_plan(path: Path | str | None, options: CheckOptions) -> tuple[Any, CheckOptions]:
    """The plan file's plan (None without one), and the options with its NUM_GPU where they set
    none (a plain check reads them; the driver applies the plan's NUM_GPU itself)."""
    if path is None:
        return None, options
    from ..compiler.frontend.shard_plan import load_plan
    plan = load_plan(path)
    if plan.num_gpu is not None and options.num_gpu is None:
        options = replace(options, num_gpu=plan.num_gpu)
    return plan, options


def compile_program(path: Path | str, options: CheckOptions, sharding: Path | str | None = None) -> Any:
    """The compiled program (`compiler.driver.Compiled`), or a CompileError with its diagnostics."""
    from ..compiler.driver import compile_file
    plan, options = sharding_plan(sharding, options)
    return compile_file(path, options, plan=plan)
