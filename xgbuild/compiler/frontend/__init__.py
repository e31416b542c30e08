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
from .codes import FILE_ERROR, INTERNAL, NOT_UTF8, TOO_DEEP, TOO_LARGE
from .diagnostics import Diagnostic, Diagnostics, Severity, render_all
from .ast import Import
from .lexer import tokenize
from .modules import ModuleLoader
from .parser import parse
from .source import MAX_SOURCE_BYTES, Span, SourceFile, UnreadableSource, decode_source, read_source

__all__ = ["CheckOptions", "CheckResult", "MAX_SOURCE_BYTES", "TypedProgram", "check_file", "check_source",
           "deep_stack", "decode_source"]

# Errors after which nothing else is checked: the parse stopped, so the program seen is partial
# (a "no `main`" or "unknown name" after them would be noise, and would come first).
_FATAL = frozenset({TOO_DEEP.code, TOO_LARGE.code})


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
def deep_stack(limit: int = 20000):
    """Room for the recursion the checker and lowering do over a syntax tree. Not unbounded: the
    parser refuses trees deeper than MAX_TREE_DEPTH (2,500 levels), and these stages recurse a
    few frames a level, so every tree that gets here fits. CPython 3.11 runs Python-to-Python
    calls without growing the C stack, so the raised limit cannot overflow it."""
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
    if "\r" in text:
        # Line ends as Python reads them: `\r\n` and a lone `\r` (old Mac files) are newlines.
        # Done before anything records an offset, so every position refers to this text.
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    source = SourceFile(name, text)
    diags = Diagnostics(source)
    program = None
    try:
        with deep_stack():
            tokens = tokenize(text, diags)
            if any(d.code in _FATAL for d in diags.items):
                raise Diagnostics.Overflow      # stop here, as the error limit does
            module = parse(tokens, diags)
            if any(d.code in _FATAL for d in diags.items):
                raise Diagnostics.Overflow
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
    name = str(path)
    try:
        data = read_source(path)        # regular files only, at most MAX_SOURCE_BYTES
    except UnreadableSource as exc:
        return CheckResult(None, [Diagnostic(FILE_ERROR.code, Severity.ERROR, FILE_ERROR.fmt(path=name, reason=str(exc)),
                                             name, 1, 1, Span(0, 0))], None)
    try:
        text = decode_source(data)
    except UnicodeDecodeError as exc:
        return CheckResult(None, [Diagnostic(NOT_UTF8.code, Severity.ERROR, NOT_UTF8.fmt(path=name, offset=exc.start),
                                             name, 1, 1, Span(0, 0), help="XG sources are UTF-8 text")], None)
    return check_source(text, name, options)


def _dump_traceback(name: str) -> str:
    with tempfile.NamedTemporaryFile("w", prefix="xg-ice-", suffix=".txt", delete=False) as f:
        f.write(f"internal compiler error while checking {name}\n\n")
        f.write(traceback.format_exc())
        return f.name
