"""Sign analysis: which signs (-, 0, +) a value may take, to prove divisors nonzero.

The lattice and its arithmetic; each op's own sign fact is in its `OpDef.sign`.

A `Sign` is the set of possible signs of every element of a value. The rules are those of exact
arithmetic (`exp` is positive, `x * x + eps` with `eps > 0` is positive, sums of
positives are positive); the checker combines them with the facts that `if` guards establish.
"""

from __future__ import annotations

from typing import FrozenSet

Sign = FrozenSet[str]

POS: Sign = frozenset("+")
NEG: Sign = frozenset("-")
ZERO: Sign = frozenset("0")
NONNEG: Sign = frozenset("0+")
NONPOS: Sign = frozenset("-0")
NONZERO: Sign = frozenset("-+")
ANY: Sign = frozenset("-0+")

_ADD = {("+", "+"): "+", ("+", "0"): "+", ("0", "+"): "+", ("0", "0"): "0",
        ("-", "-"): "-", ("-", "0"): "-", ("0", "-"): "-"}
_MUL = {("+", "+"): "+", ("-", "-"): "+", ("+", "-"): "-", ("-", "+"): "-"}


def of_value(value: float) -> Sign:
    if value != value:   # NaN
        return ANY
    return POS if value > 0 else NEG if value < 0 else ZERO


def add(a: Sign, b: Sign) -> Sign:
    out: set[str] = set()
    for x in a:
        for y in b:
            out.update(_ADD.get((x, y), "-0+"))
    return frozenset(out)


def neg(a: Sign) -> Sign:
    return frozenset({"+": "-", "-": "+", "0": "0"}[x] for x in a)


def sub(a: Sign, b: Sign) -> Sign:
    return add(a, neg(b))


def mul(a: Sign, b: Sign) -> Sign:
    out: set[str] = set()
    for x in a:
        for y in b:
            out.add("0" if "0" in (x, y) else _MUL[(x, y)])
    return frozenset(out)


def square(a: Sign) -> Sign:
    return POS if "0" not in a else NONNEG


def reduce_sum(a: Sign) -> Sign:
    """The sign of a sum of (at least one) elements each of sign `a`."""
    out = set(a)
    if "+" in a and "-" in a:
        out.add("0")
    return frozenset(out)


def union(a: Sign, b: Sign) -> Sign:
    return a | b


def meet_refine(current: Sign, fact: Sign) -> Sign:
    """Narrow `current` by a fact a guard established; never empty."""
    narrowed = current & fact
    return narrowed or fact


def nonzero(a: Sign) -> bool:
    return "0" not in a


def positive(a: Sign) -> bool:
    return a == POS
