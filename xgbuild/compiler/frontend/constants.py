"""File-level constants: their values, and overrides from the command line.

A constant is a literal or arithmetic on literals and the constants declared above it
(`D = 768`, `F = 4 * D`, `DH = D / H`), evaluated once with the language's literal arithmetic:
exact `int64` for integers (`/` truncates toward zero), finite `float64` for floats.

`--const NAME=VALUE` (`CheckOptions.consts`) replaces the value of a constant of the compiled
file, and the constants computed from it follow: `--const D=64` makes `F` 256. Bazel's
`consts = {...}` and `xg.compile_file(consts=...)` pass the same option. An override is a value
of the constant's kind (integer, number, boolean); `parse_override` reads the command line's
text form. `COMPUTE` (the mixed-precision policy, frontend/precision.py) is not evaluated here: its
value is a dtype name, and its override (`--const COMPUTE=float32`) is read as that name.
"""

from __future__ import annotations

import math
import re

from . import ast as A
from .codes import BAD_CONST_OVERRIDE, BAD_DECL, CONST_OVERFLOW, OVERRIDE
from .diagnostics import Diagnostics
from .types import FloatLiteral, IntLiteral, TensorType

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
HARDWARE = ("TARGET_GPU", "NUM_GPU")
POLICY = ("COMPUTE",)           # constants whose value is a dtype name (frontend/precision.py)
_INT_RE = re.compile(r"[+-]?[0-9][0-9_]*", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*|[0-9][0-9_]*(?=[eE]))(?:[eE][+-]?[0-9]+)?",
                       re.ASCII)

Value = int | float | bool | str       # str: a dtype name, for a POLICY constant only


class OverrideError(ValueError):
    """A `NAME=VALUE` override that cannot be read (the caller's mistake: a usage error)."""


def parse_override(text: str) -> tuple[str, Value]:
    """`"L=2"` -> ("L", 2); `"LR=3e-4"` -> ("LR", 0.0003); `"BIAS=true"` -> ("BIAS", True)."""
    name, eq, raw = text.partition("=")
    name, raw = name.strip(), raw.strip()
    if not eq or not name:
        raise OverrideError(f"--const takes NAME=VALUE, got {text!r}")
    return check_name(name), parse_value(name, raw)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise OverrideError(f"a constant override names a constant, got {name!r}")
    if name in HARDWARE:
        option = "--target" if name == "TARGET_GPU" else "--num-gpu"
        raise OverrideError(f"`{name}` is set with {option}, not as a constant override")
    return name


def parse_value(name: str, raw: str) -> Value:
    if name in POLICY:
        # A dtype name; which dtypes the policy takes is the checker's to say (a diagnostic).
        if raw.isidentifier() and raw.isascii():
            return raw
        raise OverrideError(f"--const {name}={raw!r}: the value must be a dtype name, e.g. {name}=float32")
    if raw in ("true", "false"):
        return raw == "true"
    if _INT_RE.fullmatch(raw):
        value = int(raw.replace("_", ""))
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverrideError(f"--const {name}={raw}: the value does not fit in int64")
        return value
    if _FLOAT_RE.fullmatch(raw):
        value = float(raw.replace("_", ""))
        if math.isfinite(value):
            return value
    raise OverrideError(f"--const {name}={raw!r}: the value must be an integer, a number or true/false")


def normalize(consts: object) -> tuple[tuple[str, Value], ...]:
    """Overrides as `CheckOptions.consts` holds them: sorted (name, value) pairs, each checked.
    Takes a mapping of names to values (or to their text, as `--const` gives it)."""
    if consts is None:
        return ()
    if not hasattr(consts, "items"):
        raise OverrideError(f"consts must be a mapping of constant names to values, got {type(consts).__name__}")
    out: dict[str, Value] = {}
    for name, value in consts.items():  # type: ignore[union-attr]
        name = check_name(name)
        if isinstance(value, str):
            value = parse_value(name, value.strip())
        elif name in POLICY:
            raise OverrideError(f"consts[{name!r}] = {value!r}: the value must be a dtype name, e.g. 'float32'")
        elif not isinstance(value, (bool, int, float)) or isinstance(value, float) and not math.isfinite(value):
            raise OverrideError(f"consts[{name!r}] = {value!r}: the value must be an integer, a finite number or "
                                "a bool")
        out[name] = value
    return tuple(sorted(out.items()))


def shown(value: Value) -> str:
    if isinstance(value, str):
        return value
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


class ConstantEvaluator:
    """The value of each file-level constant, in declaration order, with the overrides applied to
    the compiled file's own constants."""

    def __init__(self, diags: Diagnostics, overrides: tuple[tuple[str, Value], ...]) -> None:
        self.diags = diags
        self.overrides = dict(overrides)
        self.applied: set[str] = set()

    def declare(self, decl: A.ConstDecl, table: dict, own: bool) -> None:
        """Evaluate `decl` into `table` (name -> (value, type)); `own`: a constant of the compiled
        file, which an override may replace."""
        value = self.evaluate(decl.value, table, decl.name)
        if value is None:
            return
        if own and decl.name in self.overrides:
            self.applied.add(decl.name)
            value = self.override(decl, value, self.overrides[decl.name])
        table[decl.name] = (value, _type_of(value))

    def override(self, decl: A.ConstDecl, declared: Value, given: Value) -> Value:
        """The value `decl` takes: `given`, or after an error the declared one (no error follows)."""
        kind = _kind(declared)
        if kind == "a float" and type(given) is int:
            given = float(given)
        if _kind(given) != kind:
            self.diags.error(BAD_CONST_OVERRIDE, decl.value.span,
                             detail=f"`--const {decl.name}={shown(given)}` gives {_kind(given)}, but `{decl.name}` is "
                                    f"{kind} constant", label=f"`{decl.name}` is {kind} here",
                             help=f"give `{decl.name}` {kind} value")
            return declared
        if given != declared or type(given) is not type(declared):
            self.diags.note(OVERRIDE, decl.span, detail=f"`{decl.name} = {self.diags.source.snippet(decl.value.span)}` "
                            f"is overridden by `--const {decl.name}={shown(given)}`")
        return given

    def unused(self, constants: dict) -> None:
        """An override of a constant the compiled file does not declare is an error."""
        import difflib
        for name in sorted(set(self.overrides) - self.applied):
            close = [c for c in constants if c.lower() == name.lower()] or \
                difflib.get_close_matches(name, list(constants), n=1)
            listed = ", ".join(f"`{c}`" for c in constants) or "none"
            self.diags.error_outside(BAD_CONST_OVERRIDE, detail=f"`--const {name}={shown(self.overrides[name])}` "
                                     f"overrides no constant of {self.diags.source.name}",
                                     help=(f"did you mean `{close[0]}`? " if close else "") + f"its constants: {listed}",
                                     notes=("only the compiled file's own constants can be overridden, not an "
                                            "imported module's",))

    # --- constant expressions ----------------------------------------------------------------------
    def evaluate(self, e: A.Expr, table: dict, name: str) -> Value | None:
        if isinstance(e, (A.IntLit, A.FloatLit, A.BoolLit)):
            return e.value
        if isinstance(e, A.Name):
            if e.id in table:
                return table[e.id][0]
            self.diags.error(BAD_DECL, e.span, detail=f"`{e.id}` is not a constant declared above `{name}`",
                             label="not a constant here",
                             help="a constant's value may use literals and the constants declared before it")
            return None
        if isinstance(e, A.Unary) and e.op in ("-", "+"):
            v = self.evaluate(e.operand, table, name)
            if v is None:
                return None
            if isinstance(v, bool):
                return self.not_arithmetic(e, name)
            return self.fits(e, -v if e.op == "-" else v, name)
        if isinstance(e, A.Binary) and e.op in ("+", "-", "*", "/", "%"):
            a = self.evaluate(e.left, table, name)
            b = self.evaluate(e.right, table, name)
            if a is None or b is None:
                return None
            if isinstance(a, bool) or isinstance(b, bool):
                return self.not_arithmetic(e, name)
            if e.op in ("/", "%") and b == 0:
                self.diags.error(BAD_DECL, e.right.span, detail=f"constant `{name}` divides by zero",
                                 label="this is 0")
                return None
            return self.fits(e, _arith(e.op, a, b), name)
        self.diags.error(BAD_DECL, e.span, detail=f"file-level constant `{name}` must be a literal or arithmetic "
                         "on constants", help="compute other values inside a function")
        return None

    def not_arithmetic(self, e: A.Expr, name: str) -> None:
        self.diags.error(BAD_DECL, e.span, detail=f"constant `{name}`: arithmetic on a boolean",
                         help="booleans take no `+ - * / %`")
        return None

    def fits(self, e: A.Expr, v: int | float, name: str) -> Value | None:
        if isinstance(v, int) and not _INT64_MIN <= v <= _INT64_MAX:
            self.diags.error(CONST_OVERFLOW, e.span, detail=f"constant `{name}` overflows `int64`",
                             help="integer constants are `int64`: -9223372036854775808 to 9223372036854775807")
            return None
        if isinstance(v, float) and not math.isfinite(v):
            self.diags.error(CONST_OVERFLOW, e.span, detail=f"constant `{name}` is not a finite `float64`",
                             help="float constants must be finite (at most about 1.8e308)")
            return None
        return v


def _arith(op: str, a: int | float, b: int | float) -> int | float:
    both_int = isinstance(a, int) and isinstance(b, int)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return _truncating_div(a, b) if both_int else a / b  # type: ignore[arg-type]
    return a - b * _truncating_div(a, b) if both_int else math.fmod(a, b)  # type: ignore[arg-type]


def _truncating_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _kind(value: Value) -> str:
    if isinstance(value, str):          # a dtype name: only a POLICY constant takes one
        return "a dtype name"
    return "a boolean" if isinstance(value, bool) else "an integer" if isinstance(value, int) else "a float"


def _type_of(value: Value):
    if isinstance(value, bool):
        return TensorType("bool", ())
    return IntLiteral(value) if isinstance(value, int) else FloatLiteral(value)
