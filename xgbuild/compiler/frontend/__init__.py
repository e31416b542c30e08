"""Frontend: `.xg` source -> typed AST, with rustc-style diagnostics.

`check_file` / `check_source` run lexer, parser and checker and never raise for a problem in the
program or the file: every outcome is a `CheckResult` with diagnostics. A failure inside XG itself
becomes one XG0900 diagnostic naming the dump file that holds the traceback.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .checker import CheckOptions, ProgramChecker, TypedProgram
from .codes import FILE_ERROR, INTERNAL, NOT_UTF8
from .diagnostics import Diagnostic, Diagnostics, Severity, render_all
from .ast import Import
from .lexer import tokenize
from .modules import ModuleLoader
from .parser import parse
from .source import Span, SourceFile

__all__ = ["CheckOptions", "CheckResult", "TypedProgram", "check_file", "check_source"]

MAX_SOURCE_BYTES = 64 << 20


@dataclass(frozen=True)
class CheckResult:
    source: SourceFile | None
    diagnostics: list[Diagnostic]
    program: TypedProgram | None        # None when there were errors

    @property
    def ok(self) -> bool:
        return not any(d.severity is Severity.ERROR for d in self.diagnostics)

    def render(self) -> str:
        return render_all(self.diagnostics, self.source)

    def to_json(self) -> dict:
        return {"ok": self.ok, "diagnostics": [d.to_json() for d in self.diagnostics]}


@contextmanager
def _deep_stack(limit: int = 20000):
    # The parser bounds nesting, but long operator chains (`a + b + ...`) still build deep trees;
    # CPython 3.11 runs Python-to-Python calls without growing the C stack, so this is safe.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def check_source(text: str, name: str = "<input>", options: CheckOptions = CheckOptions()) -> CheckResult:
    base = Path(name).resolve().parent if name and not name.startswith("<") else Path.cwd()
    return check_source_with_loader(text, name, options, ModuleLoader(options, base, check_source_with_loader))


def check_source_with_loader(text: str, name: str, options: CheckOptions, loader: "ModuleLoader") -> CheckResult:
    source = SourceFile(name, text)
    diags = Diagnostics(source)
    program = None
    try:
        with _deep_stack():
            tokens = tokenize(text, diags)
            module = parse(tokens, diags)
            imported = loader.load_all(module, diags)
            module.decls = [d for d in module.decls if not isinstance(d, Import)] + imported
            program = ProgramChecker(diags, options).run(module)
    except Diagnostics.Overflow:
        program = None
    except Exception:  # an XG bug, not a user mistake: say so, keep the traceback for the report
        dump = _dump_traceback(name)
        diags.items.append(Diagnostic(INTERNAL.code, Severity.ERROR, INTERNAL.fmt(detail=f"the checker failed; "
                                      f"traceback written to {dump}"), name, 1, 1, Span(0, 0)))
        program = None
    items = diags.sorted()
    ok = not any(d.severity is Severity.ERROR for d in items)
    return CheckResult(source, items, program if ok else None)


def check_file(path: Path | str, options: CheckOptions = CheckOptions()) -> CheckResult:
    path = Path(path)
    name = str(path)
    try:
        if path.is_dir():
            raise IsADirectoryError("it is a directory")
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
        if len(data) > MAX_SOURCE_BYTES:
            raise OSError(f"larger than {MAX_SOURCE_BYTES >> 20} MiB")
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return CheckResult(None, [Diagnostic(FILE_ERROR.code, Severity.ERROR, FILE_ERROR.fmt(path=name, reason=reason.lower()),
                                             name, 1, 1, Span(0, 0))], None)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return CheckResult(None, [Diagnostic(NOT_UTF8.code, Severity.ERROR, NOT_UTF8.fmt(path=name, offset=exc.start),
                                             name, 1, 1, Span(0, 0), help="XG sources are UTF-8 text")], None)
    if text.startswith("\ufeff"):
        text = text[1:]     # a UTF-8 byte-order mark is not part of the program
    return check_source(text, name, options)


def _dump_traceback(name: str) -> str:
    with tempfile.NamedTemporaryFile("w", prefix="xg-ice-", suffix=".txt", delete=False) as f:
        f.write(f"internal compiler error while checking {name}\n\n")
        f.write(traceback.format_exc())
        return f.name
