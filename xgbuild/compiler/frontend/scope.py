"""Scopes for the checker: variables, their facts, and function signatures.

A `Var` is one definition (parameter, local, external, constant); it is shared by every copy of a
scope, so `used`/`handled` marks survive branches. A `Scope` maps names to (Var, Sign): branches
copy it and refine signs (the facts `if` guards establish) without touching the definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ast as A
from ..ops.sign import Sign
from .source import Span
from .types import Type


@dataclass(eq=False)
class Var:
    name: str
    type: Type
    span: Span
    kind: str                   # "param" | "local" | "extern" | "const" | "binding"
    used: bool = False
    handled: bool = False       # for Result values: matched, unwrapped, returned or passed on


@dataclass
class Scope:
    vars: dict[str, tuple[Var, Sign]] = field(default_factory=dict)

    def copy(self) -> "Scope":
        return Scope(dict(self.vars))

    def get(self, name: str) -> tuple[Var, Sign] | None:
        return self.vars.get(name)

    def bind(self, var: Var, sign: Sign) -> None:
        self.vars[var.name] = (var, sign)

    def refine(self, name: str, sign: Sign) -> None:
        if name in self.vars:
            var, _ = self.vars[name]
            self.vars[name] = (var, sign)


@dataclass(frozen=True)
class FuncSig:
    name: str
    params: tuple[tuple[str, Type], ...]
    ret: Type                   # TupleType(()) when the function returns nothing
    node: A.FuncDef
    declared_ret: bool
    ok: bool                    # False when the signature itself had errors
