"""Compile, the build's first step: an `.xg` source and its `--sharding` plan file to the
optimised program (the compiler driver does the work), and its text as `xgc --emit ir-opt` shows
it. Light: no torch, no Triton.
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


def ir_opt_text(compiled: Any, settings: Any) -> str:
    """The optimised IR (`xgc --emit ir-opt`); with NUM_GPU > 1, the plan (as comments) before it
    and each value's layout (`@S(0)`), or in a pipeline the GPU that computes it (`@gpu1`;
    `@each`: every GPU that uses it)."""
    from ..compiler.ir.layout import infer_layouts
    from ..compiler.ir.serialize import to_text
    from ..compiler.ir.stages import has_stages, infer_stages, stage_gpus
    from ..compiler.passes.shard import plan_lines, plan_of
    from .target import target_profile
    graph = compiled.optimized.main
    if compiled.num_gpu == 1 or "shard" not in compiled.passes:
        return to_text(graph)
    notes = {i: str(lay) for i, lay in infer_layouts(graph, compiled.num_gpu).items()}
    if has_stages(graph):        # a pipeline: the GPU (stage) each node runs on (free: each GPU that uses it)
        gpus = stage_gpus(graph)
        notes = {i: ("each" if k is None else f"gpu{gpus[k][0]}" if len(gpus[k]) == 1 else f"stage{k}")
                 for i, k in infer_stages(graph).items()}
    profile = compiled.optimized.profile or target_profile(compiled.target, settings)
    plan = plan_of(graph, compiled.num_gpu, profile)
    return "".join(f"# {line}\n" for line in plan_lines(plan)) + to_text(graph, notes)
