"""A training step's state: which of `main`'s outputs become which inputs at the next step.

Two roles an `extern` may declare (parser.py reads the word before the type):

- `extern state Tensor[float32, V, D] W`: a state input. `main`'s output leaves end with the next
  value of every state input, in the order they are declared (models/train.xg returns the loss,
  then the new parameters, then the two AdamW moments, and declares the parameters and moments
  in that order). Each pair must have one type.
- `extern counter float32 STEP`: a step counter, a scalar that advances by 1 a step; no output.

`plan_state` pairs them and checks the pairs (XG0020); the manifest records them (`entry.state`,
`entry.counters`), and `xgrun --steps N` feeds the outputs back without leaving the device.
Output leaves are named as the runtime names them: `out`, `out_0`, `out_1_0`, ...
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ast as A
from .codes import BAD_STATE
from .diagnostics import Diagnostics
from .types import ResultType, TensorType, TupleType, Type

COUNTER_DTYPES = ("float32", "int64")


@dataclass(frozen=True)
class StatePlan:
    pairs: tuple[tuple[str, str], ...] = ()   # (input, the output leaf that is its next value)
    counters: tuple[str, ...] = ()            # inputs that advance by 1 a step


def output_leaves(ty: Type | None, prefix: str = "out") -> list[tuple[str, Type]]:
    """`main`'s output leaves in order, by the runtime's names (engine.py `_flat`)."""
    if isinstance(ty, TupleType):
        return [leaf for i, t in enumerate(ty.items) for leaf in output_leaves(t, f"{prefix}_{i}")]
    return [] if ty is None else [(prefix, ty)]


def plan_state(module: A.Module, externs: dict, main_ret: Type | None, diags: Diagnostics,
               entry: str) -> StatePlan:
    """The pairs and counters the file's `extern state` / `extern counter` declare (`externs`:
    name -> checked Var); an XG0020 error for each that cannot be one. Only `main` has them: an
    engine of another entry function (`--entry`) takes that function's parameters instead."""
    decls = [d for d in module.decls if isinstance(d, A.Extern) and d.role and getattr(d, "origin", None) is None]
    if entry != "main" or not decls:
        return StatePlan()
    states = [d for d in decls if d.role == "state"]
    counters = []
    for d in decls:
        if d.role != "counter":
            continue
        ty = externs[d.name].type if d.name in externs else None
        if not (isinstance(ty, TensorType) and ty.rank == 0 and ty.dtype in COUNTER_DTYPES):
            diags.error(BAD_STATE, d.span, detail=f"counter `{d.name}` is `{ty}`, not a scalar",
                        help=f"a step counter is `extern counter float32 {d.name}` (or int64)")
            continue
        counters.append(d.name)
    if not states:
        return StatePlan((), tuple(counters))
    if isinstance(main_ret, ResultType):
        diags.error(BAD_STATE, states[0].span, detail="`main` returns a `Result`, which cannot carry state",
                    help="return the state's next values as a tuple")
        return StatePlan()
    leaves = output_leaves(main_ret)
    if len(leaves) < len(states):
        diags.error(BAD_STATE, states[0].span,
                    detail=f"{len(states)} state inputs, but `main` returns only {len(leaves)} "
                           + ("value" if len(leaves) == 1 else "values"),
                    help="`main` returns the next value of each `extern state`, last, in declaration order")
        return StatePlan()
    pairs = []
    for d, (out, out_ty) in zip(states, leaves[len(leaves) - len(states):]):
        ty = externs[d.name].type if d.name in externs else None
        if ty != out_ty:
            diags.error(BAD_STATE, d.span,
                        detail=f"state `{d.name}` is `{ty}`, but its next value, output `{out}`, is `{out_ty}`",
                        help="`main` returns the next value of each `extern state`, last, in declaration order")
            continue
        pairs.append((d.name, out))
    return StatePlan(tuple(pairs), tuple(counters))
