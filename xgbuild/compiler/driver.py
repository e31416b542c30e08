"""The compiler driver: source -> checked program -> Graph IR -> optimised IR.

One function per way in (`compile_source`, `compile_file`); every stage's output is kept on the
`Compiled` value so `xgc --emit=...` and `--dump-after=PASS` can print any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import CompileError
from .frontend import CheckOptions, CheckResult, TypedProgram, check_file, check_source
from .frontend.diagnostics import Diagnostic, Severity
from .frontend.shard_plan import ShardingPlan, check_plan
from .frontend.source import Span
from .ir.graph import Program
from .ir.lower import LoweringError, lower
from .passes import PASS_NAMES, run_pipeline
from .passes.autodiff import AutodiffError
from .passes.shard import ShardingError

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
            plan: ShardingPlan | None, entry: str) -> Compiled:
    if not result.ok or result.program is None:
        raise CompileError(result.render(), result.diagnostics)
    typed = result.program
    if plan is not None:
        check_plan(plan, typed, typed.num_gpu)
    try:
        lowered = replace(lower(typed, plan, entry), target=typed.target or DEFAULT_TARGET)
    except LoweringError as exc:
        raise CompileError(f"error: {exc}", result.diagnostics) from None
    try:
        optimized = run_pipeline(lowered, stop_after=stop_after, verify_each=verify_each)
    except AutodiffError as exc:
        raise CompileError(_located(result, "XG0112", str(exc), exc.src), result.diagnostics) from None
    except ShardingError as exc:
        line, col = exc.src[:2] if exc.src else (0, 0)
        diag = Diagnostic(exc.code, Severity.ERROR, str(exc), result.source.name if result.source else name,
                          line, col, Span(0, 0), help=exc.help or "")
        raise CompileError(_located(result, exc.code, str(exc), exc.src, exc.help),
                           [*result.diagnostics, diag]) from None
    return Compiled(Path(name).name, result.source.text if result.source else "", result, typed, lowered,
                    optimized, typed.target or DEFAULT_TARGET, typed.num_gpu, plan=plan)


def _located(result: CheckResult, code: str, message: str, src: tuple | None, help: str | None = None) -> str:
    """A diagnostic-style message for an error found after checking (in lowering or a pass)."""
    tail = f"\n  |\n  = help: {help}" if help else ""
    if src and len(src) == 2 and result.source is not None:
        line, col = src
        text = result.source.line_text(line)
        return (f"error[{code}]: {message}\n --> {result.source.name}:{line}:{col}\n  |\n"
                f"{line} | {text}\n  | {' ' * (col - 1)}^" + tail)
    return f"error[{code}]: {message}" + tail


def compile_source(text: str, name: str = "program.xg", options: CheckOptions = CheckOptions(), *,
                   stop_after: str | None = None, verify_each: bool = False,
                   plan: ShardingPlan | None = None) -> Compiled:
    return _finish(check_source(text, name, _with_plan(options, plan)), name, stop_after, verify_each, plan,
                   options.entry)


def compile_file(path: Path | str, options: CheckOptions = CheckOptions(), *,
                 stop_after: str | None = None, verify_each: bool = False,
                 plan: ShardingPlan | None = None) -> Compiled:
    return _finish(check_file(path, _with_plan(options, plan)), str(path), stop_after, verify_each, plan,
                   options.entry)


def _with_plan(options: CheckOptions, plan: ShardingPlan | None) -> CheckOptions:
    """A plan's `num_gpu` stands in for `--num-gpu` when that is not given."""
    if plan is not None and plan.num_gpu is not None and options.num_gpu is None:
        return replace(options, num_gpu=plan.num_gpu)
    return options
