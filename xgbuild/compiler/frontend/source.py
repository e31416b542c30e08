"""Source files and spans: byte-free text positions, 1-based line/column lookup.

A `Span` is a half-open range of character offsets into one `SourceFile`; diagnostics carry
spans and the renderer turns them into `file:line:col` and caret lines.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple


class Span(NamedTuple):   # a NamedTuple, not a dataclass: the lexer makes one per token
    start: int
    end: int

    def to(self, other: "Span") -> "Span":
        return Span(min(self.start, other.start), max(self.end, other.end))


NO_SPAN = Span(0, 0)


@dataclass(frozen=True)
class SourceFile:
    name: str
    text: str
    line_starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = [0]
        find = self.text.find
        pos = find("\n")
        while pos != -1:
            starts.append(pos + 1)
            pos = find("\n", pos + 1)
        object.__setattr__(self, "line_starts", tuple(starts))

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        idx = bisect.bisect_right(self.line_starts, offset) - 1
        return idx + 1, offset - self.line_starts[idx] + 1

    def line_text(self, line: int) -> str:
        start = self.line_starts[line - 1]
        end = self.line_starts[line] - 1 if line < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r")

    def snippet(self, span: Span) -> str:
        return self.text[span.start:span.end]
