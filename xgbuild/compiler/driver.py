"""The compiler driver: source -> checked program -> Graph IR -> optimised IR.

One function per way in (`compile_source`, `compile_file`); every stage's output is kept on the
`Compiled` value so `xgc --emit=...` and `--dump-after=PASS` can print any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CompileError
from .frontend import CheckOptions, CheckResult, TypedProgram, check_file, check_source
from .ir.graph import Program
from .ir.lower import LoweringError, lower
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


def _finish(result: CheckResult, name: str, stop_after: str | None, verify_each: bool, entry: str) -> Compiled:
    if not result.ok or result.program is None:
        raise CompileError(result.render(), result.diagnostics)
    typed = result.program
    try:
        lowered = lower(typed, entry)
    except LoweringError as exc:
        raise CompileError(f"error: {exc}", result.diagnostics) from None
    try:
        optimized = run_pipeline(lowered, stop_after=stop_after, verify_each=verify_each)
    except AutodiffError as exc:
        raise CompileError(_located(result, "XG0112", str(exc), exc.src), result.diagnostics) from None
    return Compiled(Path(name).name, result.source.text if result.source else "", result, typed, lowered,
                    optimized, typed.target or DEFAULT_TARGET, typed.num_gpu)


def _located(result: CheckResult, code: str, message: str, src: tuple | None) -> str:
    """A diagnostic-style message for an error found after checking (in lowering or a pass)."""
    if src and len(src) == 2 and result.source is not None:
        line, col = src
        text = result.source.line_text(line)
        return (f"error[{code}]: {message}\n --> {result.source.name}:{line}:{col}\n  |\n"
                f"{line} | {text}\n  | {' ' * (col - 1)}^")
    return f"error[{code}]: {message}"


def compile_source(text: str, name: str = "program.xg", options: CheckOptions = CheckOptions(), *,
                   stop_after: str | None = None, verify_each: bool = False) -> Compiled:
    return _finish(check_source(text, name, options), name, stop_after, verify_each, options.entry)


def compile_file(path: Path | str, options: CheckOptions = CheckOptions(), *,
                 stop_after: str | None = None, verify_each: bool = False) -> Compiled:
    return _finish(check_file(path, options), str(path), stop_after, verify_each, options.entry)
