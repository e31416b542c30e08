"""Diagnostics: the value every frontend stage reports, and its rustc-style rendering.

    error[XG0100]: mismatched dtypes: `int64` + `float32`
     --> model.xg:3:12
      |
    3 |     return a + b
      |            ^^^^^ `int64` and `float32` cannot be combined without a cast
      |
      = help: convert one side explicitly, e.g. `cast(b, int64)`
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from ...errors import CompileError
from .codes import CODES, TOO_MANY, Code
from .source import SourceFile, Span

MAX_ERRORS = 100
_MAX_SHOWN_LINE = 160  # a 1 MB line is shown as a window around the caret


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    message: str
    file: str
    line: int
    col: int
    span: Span
    label: str = ""
    help: str = ""
    notes: tuple[str, ...] = ()
    end_line: int = 0       # where the span ends (1-based, exclusive column); 0 without a source line
    end_col: int = 0

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "end_line": self.end_line,
            "end_col": self.end_col,
            "help": self.help or None,
            "notes": list(self.notes),
        }


@dataclass
class Diagnostics:
    """Collects diagnostics for one source file; stops taking errors after MAX_ERRORS."""

    source: SourceFile
    items: list[Diagnostic] = field(default_factory=list)
    error_lines: set[int] = field(default_factory=set)
    _errors: int = 0

    class Overflow(Exception):
        """Raised once the error limit is reached, to unwind the checker."""

    def emit(self, code: Code, span: Span, severity: Severity = Severity.ERROR, *,
             label: str = "", help: str = "", notes: tuple[str, ...] = (), **fmt: object) -> None:
        line, col = self.source.line_col(span.start)
        end_line, end_col = self.source.line_col(max(span.start, span.end))
        self.items.append(Diagnostic(code.code, severity, code.fmt(**fmt), self.source.name,
                                     line, col, span, label, help, notes, end_line, end_col))
        if severity is Severity.ERROR:
            self.error_lines.add(line)
            self._errors += 1
            if self._errors >= MAX_ERRORS:
                self.items.append(Diagnostic(TOO_MANY.code, Severity.ERROR, TOO_MANY.fmt(limit=MAX_ERRORS),
                                             self.source.name, line, col, span))
                raise Diagnostics.Overflow

    def error_outside(self, code: Code, *, help: str = "", notes: tuple[str, ...] = (), **fmt: object) -> None:
        """An error in what was given beside the source (a command-line option): no line of the
        file is shown."""
        self.items.append(Diagnostic(code.code, Severity.ERROR, code.fmt(**fmt), self.source.name, 0, 0,
                                     Span(0, 0), help=help, notes=notes))
        self._errors += 1

    def error(self, code: Code, span: Span, **kw: object) -> None:
        self.emit(code, span, Severity.ERROR, **kw)

    def warning(self, code: Code, span: Span, **kw: object) -> None:
        self.emit(code, span, Severity.WARNING, **kw)

    def note(self, code: Code, span: Span, **kw: object) -> None:
        self.emit(code, span, Severity.NOTE, **kw)

    @property
    def has_errors(self) -> bool:
        return self._errors > 0

    @property
    def error_count(self) -> int:
        return self._errors

    def sorted(self) -> list[Diagnostic]:
        # Stable order: by position, then as emitted. The overflow marker stays last.
        body = [d for d in self.items if d.code != TOO_MANY.code]
        tail = [d for d in self.items if d.code == TOO_MANY.code]
        return sorted(body, key=lambda d: (d.span.start, d.span.end)) + tail


def _window(text: str, col0: int, width: int) -> tuple[str, int]:
    """Cut a long line to a window around column `col0` (0-based); returns (text, new col0)."""
    if len(text) <= _MAX_SHOWN_LINE:
        return text, col0
    start = max(0, min(col0 - _MAX_SHOWN_LINE // 3, len(text) - _MAX_SHOWN_LINE))
    piece = text[start:start + _MAX_SHOWN_LINE]
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + _MAX_SHOWN_LINE < len(text) else ""
    return prefix + piece + suffix, col0 - start + len(prefix)


def _printable(text: str) -> str:
    return "".join(ch if ch == "\t" or (ch.isprintable() and ord(ch) < 0x10000) else "\ufffd"
                   for ch in text).replace("\t", " ")


def render(diag: Diagnostic, source: SourceFile | None) -> str:
    """Render one diagnostic the way rustc does."""
    head = f"{diag.severity.value}[{diag.code}]: {diag.message}"
    if source is None or diag.line == 0:
        # No line to show: an unreadable file, no file at all (an imported model), or an option
        # given outside the source (`--const`).
        lines = [head] + ([f" --> {diag.file}"] if diag.file else [])
        lines += [f"  = note: {note}" for note in diag.notes]
        if diag.help:
            lines.append(f"  = help: {diag.help}")
        return "\n".join(lines)
    gutter = " " * len(str(diag.line))
    lines = [head, f"{gutter}--> {diag.file}:{diag.line}:{diag.col}"]
    text = _printable(source.line_text(diag.line))
    end_line, end_col = source.line_col(max(diag.span.start, diag.span.end - 1))
    col0 = diag.col - 1
    width = max(1, (end_col - col0) if end_line == diag.line and diag.span.end > diag.span.start else 1)
    text, col0 = _window(text, col0, width)
    width = max(1, min(width, len(text) - col0)) if col0 < len(text) else 1
    lines.append(f"{gutter} |")
    lines.append(f"{diag.line} | {text}")
    caret = " " * col0 + "^" * width + (f" {diag.label}" if diag.label else "")
    lines.append(f"{gutter} | {caret}")
    if diag.help or diag.notes:
        lines.append(f"{gutter} |")
    for note in diag.notes:
        lines.append(f"{gutter} = note: {note}")
    if diag.help:
        lines.append(f"{gutter} = help: {diag.help}")
    return "\n".join(lines)


def error_at(code: Code, message: str, source: SourceFile | None, file: str, src: tuple | None,
             earlier: list[Diagnostic] = (), help: str = "") -> CompileError:
    """A CompileError for an error found after checking (lowering, a pass) at `src`: a (line, col)
    of `source`, or (line, col, module) in an imported module, which is named in a note. `message`
    is `code`'s template, formatted; the diagnostics are the check's (`earlier`) and this one."""
    shown = source if src and len(src) == 2 else None
    notes = (f"in the imported module `{src[2]}`, line {src[0]}, column {src[1]}",) if src and len(src) == 3 else ()
    line, col = src[:2] if shown else (0, 0)
    diag = Diagnostic(code.code, Severity.ERROR, message, source.name if source else file,
                      line, col, Span(0, 0), help=help, notes=notes)
    return CompileError(render(diag, shown), [*earlier, diag])


def plain_error(code: Code, *, help: str = "", notes: tuple[str, ...] = (), **fmt: object) -> CompileError:
    """A CompileError with one diagnostic for a failure that no source line shows (an imported
    model, a kernel), rendered like every other."""
    diag = Diagnostic(code.code, Severity.ERROR, code.fmt(**fmt), "", 0, 0, Span(0, 0), help=help, notes=notes)
    return CompileError(render(diag, None), [diag])


def render_all(diags: list[Diagnostic], source: SourceFile | None) -> str:
    parts = [render(d, source) for d in diags]
    errors = sum(d.severity is Severity.ERROR for d in diags)
    warnings = sum(d.severity is Severity.WARNING for d in diags)
    if errors:
        s = "s" if errors != 1 else ""
        parts.append(f"error: could not compile `{diags[0].file}` due to {errors} previous error{s}"
                     + (f"; {warnings} warning{'s' if warnings != 1 else ''} emitted" if warnings else ""))
    return "\n\n".join(parts)


_ANSI = {"error": "\x1b[1;31m", "warning": "\x1b[1;33m", "note": "\x1b[1;32m", "help": "\x1b[1;36m",
         "gutter": "\x1b[1;34m", "bold": "\x1b[1m", "reset": "\x1b[0m"}
_HEAD = re.compile(r"^(error|warning|note)(\[XG\d{4}\])?(:)(.*)$")
_GUTTER = re.compile(r"^( *(?:\d+ )?)(\||-->|=)( ?)(.*)$")


def colorize(text: str) -> str:
    """Rendered diagnostics with rustc's colours (ANSI): the severity and message bold and
    coloured, the gutter blue, carets in the severity's colour. The CLI applies it only on a
    terminal, and not under NO_COLOR."""
    a, out, level = _ANSI, [], "error"
    for line in text.split("\n"):
        head = _HEAD.match(line)
        if head:
            level = head.group(1)
            out.append(f"{a[level]}{head.group(1)}{head.group(2) or ''}{a['reset']}{a['bold']}:{head.group(4)}{a['reset']}")
            continue
        gut = _GUTTER.match(line)
        if not gut:
            out.append(line)
            continue
        lead, mark, space, rest = gut.groups()
        if mark == "|" and rest.lstrip().startswith("^"):
            pad = len(rest) - len(rest.lstrip())
            rest = f"{rest[:pad]}{a[level]}{rest[pad:]}{a['reset']}"
        elif mark == "=" and ":" in rest:
            kind, _, body = rest.partition(":")
            rest = f"{a['bold']}{kind}{a['reset']}:{body}"
        out.append(f"{a['gutter']}{lead}{mark}{a['reset']}{space}{rest}")
    return "\n".join(out)


def explain(code: str) -> str | None:
    entry = CODES.get(code.upper())
    if entry is None:
        return None
    return f"{entry.code}: {entry.title}\n\n{entry.explanation}\n"
