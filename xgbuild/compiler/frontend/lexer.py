"""Lexer: source text -> tokens.

Newlines end statements, except inside `(...)` and `[...]`, where they are skipped. Each token
knows its column and whether it starts its line, which is all the parser needs for the seed's
indented `with shard(...):` blocks.

Only ASCII digits make numbers (the pattern is compiled with re.ASCII: Python's `\\d` would take
`৪`, a Bengali four that renders like 8, as a digit). Any other non-ASCII character outside a
comment or a string is an error that names the character by its Unicode name, so a confusable
is visible in the message. A file yields at most MAX_TOKENS tokens; past that the lexer stops with
one error, which bounds the time and memory everything after it takes.
"""

from __future__ import annotations

import re
import unicodedata
from enum import Enum
from typing import NamedTuple

from .codes import BAD_CHAR, TOO_LARGE
from .diagnostics import Diagnostics
from .source import Span


class T(str, Enum):
    NAME = "name"
    INT = "integer"
    FLOAT = "float"
    STRING = "string"
    OP = "operator"
    KEYWORD = "keyword"
    NEWLINE = "newline"
    EOF = "end of file"


KEYWORDS = frozenset({"import", "def", "return", "if", "else", "with", "match", "extern", "true", "false",
                      "and", "or", "not", "for", "in"})

MAX_TOKENS = 1 << 18   # a few seconds and a few hundred MB to check; the largest program shipped has ~1,200

_OPS = ["->", "=>", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "@", "<", ">", "=",
        "(", ")", "[", "]", "{", "}", ",", ":", ";", "."]

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\f]+)
  | (?P<comment>\#[^\n]*)
  | (?P<nl>\n)
  | (?P<float>(?:\d[\d_]*\.\d[\d_]*|\.\d[\d_]*|\d[\d_]*\.(?![A-Za-z_.]))(?:[eE][+-]?\d+)?|\d[\d_]*[eE][+-]?\d+)
  | (?P<int>\d[\d_]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\[^\n])*")
  | (?P<op>""" + "|".join(re.escape(op) for op in _OPS) + r""")
  | (?P<bad>[^ \t\r\f\n\#"A-Za-z0-9_=+\-*/%@<>()\[\]{},:;.!]+|.)
    """,
    re.VERBOSE | re.ASCII,
)


class Token(NamedTuple):
    kind: T
    text: str
    span: Span
    col: int          # 0-based column of the first character
    first: bool       # first token on its line

    def is_op(self, text: str) -> bool:
        return self.kind is T.OP and self.text == text

    def is_kw(self, text: str) -> bool:
        return self.kind is T.KEYWORD and self.text == text

    def describe(self) -> str:
        if self.kind is T.EOF:
            return "end of file"
        if self.kind is T.NEWLINE:
            return "end of line"
        shown = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return f"`{shown}`"


def tokenize(text: str, diags: Diagnostics) -> list[Token]:
    tokens: list[Token] = []
    append = tokens.append
    depth = 0            # () and [] nesting: newlines inside them do not end statements
    line_start = 0
    first = True
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        start, end = m.span()
        if kind == "ws" or kind == "comment":
            continue
        if kind == "nl":
            if depth == 0 and tokens and tokens[-1].kind is not T.NEWLINE:
                append(Token(T.NEWLINE, "\n", Span(start, end), start - line_start, False))
            line_start = end
            first = True
            continue
        col = start - line_start
        value = m.group()
        if kind == "bad":
            if value.startswith('"'):
                diags.error(BAD_CHAR, Span(start, end), detail="unterminated string literal")
            else:
                _bad_characters(value, Span(start, end), diags)
            first = False
            continue
        if kind == "name":
            tok_kind = T.KEYWORD if value in KEYWORDS else T.NAME
        elif kind == "op":
            tok_kind = T.OP
            if value in "([":
                depth += 1
            elif value in ")]" and depth > 0:
                depth -= 1
            elif value in "{}":
                # A brace always starts or ends a block: newlines matter again inside it, even
                # when an unbalanced `(` precedes it, which keeps one missing `)` from swallowing
                # the rest of the file.
                depth = 0
        else:
            tok_kind = {"int": T.INT, "float": T.FLOAT, "string": T.STRING}[kind]
        append(Token(tok_kind, value, Span(start, end), col, first))
        first = False
        if len(tokens) >= MAX_TOKENS:
            diags.error(TOO_LARGE, Span(start, end), what="tokens", limit=f"{MAX_TOKENS:,}",
                        help="split the program into modules, or generate loops over data instead of code")
            break
    if tokens and tokens[-1].kind is not T.NEWLINE:
        append(Token(T.NEWLINE, "", Span(len(text), len(text)), 0, False))
    append(Token(T.EOF, "", Span(len(text), len(text)), 0, True))
    return tokens


def _bad_characters(value: str, span: Span, diags: Diagnostics) -> None:
    """One error for a run of characters no token starts with, naming the first non-ASCII one by
    its Unicode name: `৪` reads as `8`, `０` as `0`, a Cyrillic `а` as `a`."""
    shown = value if len(value) <= 20 else value[:17] + "..."
    odd = next((ch for ch in value if ord(ch) > 0x7F), None)
    plural = "s" if len(value) > 1 else ""
    if odd is None:
        diags.error(BAD_CHAR, span, detail=f"invalid character{plural} {shown!r} in source",
                    help="XG source is ASCII outside comments and strings")
        return
    name = unicodedata.name(odd, "unnamed")
    detail = f"invalid character{plural} {shown!r} in source: U+{ord(odd):04X} {name}"
    if unicodedata.category(odd) == "Nd":
        help = (f"numbers use the ASCII digits 0-9 only; this is the digit {unicodedata.digit(odd)} of another "
                "script")
    else:
        help = "XG source is ASCII outside comments and strings; names are ASCII letters, digits and `_`"
    diags.error(BAD_CHAR, span, detail=detail, help=help)
