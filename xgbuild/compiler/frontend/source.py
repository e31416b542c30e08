"""Source files and spans: byte-free text positions, 1-based line/column lookup; reading a
source file safely.

A `Span` is a half-open range of character offsets into one `SourceFile`; diagnostics carry
spans and the renderer turns them into `file:line:col` and caret lines. `read_source` is the one
way a main file or an imported module is read: only a regular file, at most MAX_SOURCE_BYTES.
"""

from __future__ import annotations

import bisect
import os
import stat
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

# The largest source file (main file or module) XG reads. Generated programs stay far below it;
# together with the lexer's token cap it bounds the time and memory one check can take.
MAX_SOURCE_BYTES = 16 << 20


class UnreadableSource(Exception):
    """A source or module that cannot be read: missing, not a regular file, too large; the
    message is the reason, lowercase, for `cannot read PATH: REASON`."""


def read_source(path: Path | str, limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. Opened with O_NONBLOCK so that a FIFO
    without a writer cannot block the open; anything but a regular file (a FIFO, a device such as
    /dev/zero, a socket, a directory) is refused before a byte is read, and at most `limit` + 1
    bytes are ever read, so a file that grows while it is read cannot exhaust memory."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnreadableSource(_reason(exc)) from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            raise UnreadableSource("it is a directory")
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a file")
            raise UnreadableSource(f"not a regular file ({kind}); XG reads only regular files")
        if info.st_size > limit:
            raise UnreadableSource(_too_large(limit))
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UnreadableSource(_reason(exc)) from None
    finally:
        os.close(fd)
    if size > limit:            # it grew while it was read
        raise UnreadableSource(_too_large(limit))
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"larger than {limit >> 20} MiB, the most XG reads as one source"


def decode_source(data: bytes) -> str:
    """A source file's text: UTF-8, without a byte-order mark (not part of the program)."""
    text = data.decode("utf-8")
    return text[1:] if text.startswith("\ufeff") else text


def _reason(exc: OSError) -> str:
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


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
    line_starts: array = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # An array of machine ints, not a tuple of Python ints: a file of millions of empty lines
        # costs 8 bytes a line here, not 36.
        starts = array("q", [0])
        find = self.text.find
        pos = find("\n")
        while pos != -1:
            starts.append(pos + 1)
            pos = find("\n", pos + 1)
        object.__setattr__(self, "line_starts", starts)

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
