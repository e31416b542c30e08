"""The compiler driver: source -> checked program -> Graph IR -> optimised IR.

One function per way in (`compile_source`, `compile_file`); every stage's output is kept on the
`Compiled` value so `xgc --emit=...` and `--dump-after=PASS` can print any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import CompileError
from ..hw import load_profile
from .frontend import CheckOptions, CheckResult, TypedProgram, check_file, check_source
from .frontend.codes import CODES, NOT_DIFFERENTIABLE, NOT_LOWERED
from .frontend.diagnostics import error_at
from .frontend.shard_plan import ShardingPlan, check_plan
from .ir.graph import Program
from .ir.lower import LoweringError, lower
from .ir.planner import ShardingError
from .passes import PASS_NAMES, run_pipeline
from .passes.autodiff import AutodiffError

DEFAULT_TARGET = "H100"


@dataclass(frozen=True)
class Compiled:
    name: str                  # the source's file name (no directories: engines are path-free)
    source: str
    check: CheckResult
    typed: TypedProgram
    lowered: Program
    optimized: Program
    target: str
    num_gpu: int
    passes: tuple[str, ...] = field(default=tuple(PASS_NAMES))
    plan: ShardingPlan | None = None      # the --sharding file, if any (kept in the engine's sources)


def _finish(result: CheckResult, name: str, stop_after: str | None, verify_each: bool,
            plan: ShardingPlan | None, options: CheckOptions) -> Compiled:
    if not result.ok or result.program is None:
        raise CompileError(result.render(), result.diagnostics)
    typed = result.program
    if plan is not None:
        check_plan(plan, typed, typed.num_gpu)
    source, file, earlier = result.source, Path(name).name, result.diagnostics
    # The profile the checker loaded from `options.hw_dir`, or without a TARGET_GPU the default
    # target's from the same directory: the passes read it from the Program, never load it.
    profile = typed.profile if typed.profile is not None else load_profile(DEFAULT_TARGET, options.hw_dir)
    try:
        lowered = replace(lower(typed, plan, options.entry), target=typed.target or DEFAULT_TARGET,
                          profile=profile)
    except LoweringError as exc:
        if exc.code is not None:        # a limit (XG0008), not a construct the compiler lacks
            raise error_at(CODES[exc.code], str(exc), source, file, exc.src, earlier) from None
        raise error_at(NOT_LOWERED, NOT_LOWERED.fmt(detail=str(exc)), source, file, exc.src, earlier) from None
    try:
        optimized = run_pipeline(lowered, stop_after=stop_after, verify_each=verify_each)
    except AutodiffError as exc:
        raise error_at(NOT_DIFFERENTIABLE, str(exc), source, file, exc.src, earlier) from None
    except ShardingError as exc:
        raise error_at(CODES[exc.code], str(exc), source, file, exc.src, earlier, exc.help or "") from None
    return Compiled(Path(name).name, result.source.text if result.source else "", result, typed, lowered,
                    optimized, typed.target or DEFAULT_TARGET, typed.num_gpu, plan=plan)


def compile_source(text: str, name: str = "program.xg", options: CheckOptions = CheckOptions(), *,
                   stop_after: str | None = None, verify_each: bool = False,
                   plan: ShardingPlan | None = None) -> Compiled:
    return _finish(check_source(text, name, _with_plan(options, plan)), name, stop_after, verify_each, plan,
                   options)


def compile_file(path: Path | str, options: CheckOptions = CheckOptions(), *,
                 stop_after: str | None = None, verify_each: bool = False,
                 plan: ShardingPlan | None = None) -> Compiled:
    return _finish(check_file(path, _with_plan(options, plan)), str(path), stop_after, verify_each, plan,
                   options)


def _with_plan(options: CheckOptions, plan: ShardingPlan | None) -> CheckOptions:
    """A plan's `num_gpu` stands in for `--num-gpu` when that is not given."""
    if plan is not None and plan.num_gpu is not None and options.num_gpu is None:
        return replace(options, num_gpu=plan.num_gpu)
    return options
