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
    """Names to (Var, Sign). A branch is an overlay on its parent (`copy` is O(1)): it holds only
    what the branch binds or refines, so joining the branches of an `if` costs what they changed,
    not every name in scope (a function of 10,000 `if`s was quadratic). Overlays nest only as
    deep as `if`s and `match` arms do, which the parser bounds."""

    vars: dict[str, tuple[Var, Sign]] = field(default_factory=dict)   # this scope's own entries
    parent: "Scope | None" = None

    def copy(self) -> "Scope":
        return Scope({}, self)

    def get(self, name: str) -> tuple[Var, Sign] | None:
        scope: Scope | None = self
        while scope is not None:
            found = scope.vars.get(name)
            if found is not None:
                return found
            scope = scope.parent
        return None

    def bind(self, var: Var, sign: Sign) -> None:
        self.vars[var.name] = (var, sign)

    def refine(self, name: str, sign: Sign) -> None:
        found = self.get(name)
        if found is not None:
            self.vars[name] = (found[0], sign)

    def names(self) -> list[str]:
        """Every name visible here (for "did you mean" hints)."""
        out: dict[str, None] = {}
        scope: Scope | None = self
        while scope is not None:
            out.update(dict.fromkeys(scope.vars))
            scope = scope.parent
        return list(out)

    def adopt(self, branch: "Scope") -> "Scope":
        """Take a branch's entries as this scope's own (the branch was the only path on)."""
        self.vars.update(branch.vars)
        return self


@dataclass(frozen=True)
class FuncSig:
    name: str
    params: tuple[tuple[str, Type], ...]
    ret: Type                   # TupleType(()) when the function returns nothing
    node: A.FuncDef
    declared_ret: bool
    ok: bool                    # False when the signature itself had errors
