"""`for l in range(N) { ... }`: loops unrolled when the program is checked.

The bounds are integer constants (literals, file-level constants, arithmetic on them), so the
checker repeats the block N times: each iteration is a copy of the block's syntax tree with fresh
node ids, checked with the loop variable bound to that iteration's constant. Every later stage
sees straight-line code: lowering lowers the copies in order (`TypedProgram.unrolled`), `W[l]`
is an index by a constant, and a value reassigned in the block (`x = block(x, W[l])`) is the next
iteration's input, so autodiff flows through every iteration into the whole stacked `W`.

Copies, not one check of the block with `l` unknown: the checker's side tables are keyed by node
id, and a copy's types may differ (`W[l]` is checked against `W`'s leading dim for each `l`, and
`l + 1` is another constant each time).

`LoopChecker` is mixed into the function checker (checker.py).
"""

from __future__ import annotations

import dataclasses

from . import ast as A
from ..ops import sign as R
from .codes import BAD_LOOP, TOO_LARGE
from .diagnostics import Diagnostic
from .scope import Var
from .types import ErrorType, IntLiteral, TensorType

MAX_ITERATIONS = 4096          # iterations of one loop
MAX_UNROLLED = 65536           # iterations unrolled in one program, nested loops multiplied


class LoopChecker:
    """Expects the host (checker.FunctionChecker) to provide diags, scope, prog, value, block …"""

    def stmt_For(self, s: A.For) -> bool:
        bounds = [self.loop_bound(b) for b in s.bounds]
        self.loop_returns(s)
        clash = self.scope.get(s.var)
        if clash is not None:
            what = {"const": "a file-level constant", "extern": "an external", "param": "a parameter",
                    "loop": "the variable of an enclosing loop"}.get(clash[0].kind, "a value defined before the loop")
            self.diags.error(BAD_LOOP, s.var_span, detail=f"the loop variable `{s.var}` shadows {what}",
                             label=f"`{s.var}` is {what}", help="name the loop variable differently")
            return False
        if any(b is None for b in bounds):
            # Checked once for its own errors; what it defines stays, so later uses are no errors.
            self.check_body_once(s, TensorType("int64", ()), keep=True)
            return False
        start, stop = (0, bounds[0]) if len(bounds) == 1 else bounds
        values = range(start, stop)
        if len(values) > MAX_ITERATIONS:
            self.diags.error(BAD_LOOP, s.range_span, detail=f"this loop repeats its block {len(values):,} times; "
                             f"at most {MAX_ITERATIONS:,} are unrolled", label=f"{len(values):,} iterations",
                             help="loops are unrolled when compiled: compute over a tensor dimension instead")
            return False
        if not values:
            # Nothing runs, but the block is still a program: check it once, keeping nothing.
            self.check_body_once(s, TensorType("int64", ()), keep=False)
            return False
        self.prog.unrolled_count += len(values)
        if self.prog.unrolled_count > MAX_UNROLLED:
            self.diags.error(TOO_LARGE, s.range_span, what="loop iterations to unroll", limit=f"{MAX_UNROLLED:,}",
                             help="nested loops multiply; compute over a tensor dimension instead")
            return False
        copies: list[tuple[int, A.Block]] = []
        self.loop_spans.append((s.body.span.start, s.body.span.end))
        self.prog.unrolled[s.nid] = copies
        first = len(self.diags.items)
        seen: set[tuple] = set()
        errors = self.diags.error_count
        for i in values:
            body = self.prog.fresh_copy(s.body)
            copies.append((i, body))
            mark = len(self.diags.items)
            self.scope.bind(Var(s.var, IntLiteral(i), s.var_span, "loop", used=True), R.of_value(i))
            self.block(body)
            self.iteration_diagnostics(s, i, first, mark, seen, first_iteration=i == start)
            if self.diags.error_count > errors:
                break               # one iteration's errors are enough; the next would repeat them
        self.scope.vars.pop(s.var, None)
        return False

    def loop_bound(self, e: A.Expr) -> int | None:
        ty, _ = self.value(e)
        if isinstance(ty, IntLiteral):
            return ty.value
        if not isinstance(ty, ErrorType):
            shown = self.default_literal(ty)
            self.diags.error(BAD_LOOP, e.span, detail=f"the bounds of a `for` loop must be integer constants, "
                             f"found `{shown}`", label="not a constant",
                             help="loops are unrolled when compiled: bound them by a literal or a file-level "
                                  "constant (`L = 12`, then `for l in range(L)`)")
        return None

    def loop_returns(self, s: A.For) -> None:
        """A `return` in the block is an error: the loop has no value of its own."""
        stack: list[object] = [s.body]
        while stack:
            node = stack.pop()
            if isinstance(node, A.Return):
                self.diags.error(BAD_LOOP, node.span, detail="`return` inside a `for` loop",
                                 label="the loop's block may not return",
                                 help="assign the value in the loop and return it after the loop")
                return
            if isinstance(node, A.Block):
                stack.extend(node.stmts)
            elif isinstance(node, A.If):
                stack.append(node.then)
                if node.orelse is not None:
                    stack.append(node.orelse)
            elif isinstance(node, (A.With, A.For)):
                stack.append(node.body)

    def check_body_once(self, s: A.For, var_type, keep: bool) -> None:
        """Check the block once, for its errors, not unrolled; `keep`: in the enclosing scope, else
        in one of its own. Its values count as used: whether they are is not known here."""
        outer, defined = self.scope, len(self.locals)
        self.scope = outer if keep else outer.copy()
        self.scope.bind(Var(s.var, var_type, s.var_span, "loop", used=True), R.NONNEG)
        try:
            self.block(s.body)
        finally:
            self.scope.vars.pop(s.var, None)
            self.scope = outer
            for var in self.locals[defined:]:
                var.used = True

    def iteration_diagnostics(self, s: A.For, i: int, first: int, mark: int, seen: set, first_iteration: bool) -> None:
        """Report each diagnostic of the loop's block once: one an earlier iteration gave is dropped,
        and one that only a later iteration gives says which."""
        items = self.diags.items
        kept: list[Diagnostic] = []
        for d in items[mark:]:
            key = (d.code, d.span.start, d.span.end, d.message)
            if key in seen:
                continue
            seen.add(key)
            if not first_iteration and s.span.start <= d.span.start < s.span.end:
                d = dataclasses.replace(d, notes=(*d.notes, f"in the iteration where `{s.var}` is {i}"))
            kept.append(d)
        items[mark:] = kept


def fresh_copy(node, next_id) -> object:
    """A copy of a syntax tree with a fresh id on every node (`next_id()` gives them); spans,
    names and literals are shared (they are never mutated)."""
    if isinstance(node, A.Node):
        values = {}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            values[f.name] = next_id() if f.name == "nid" else fresh_copy(value, next_id)
        return type(node)(**values)
    if isinstance(node, list):
        return [fresh_copy(item, next_id) for item in node]
    return node


def max_nid(module: A.Module) -> int:
    """The largest node id of a parsed program (imported modules included)."""
    top = 0
    stack: list[object] = [module]
    while stack:
        node = stack.pop()
        if isinstance(node, A.Node):
            top = max(top, node.nid)
            stack.extend(getattr(node, f.name) for f in dataclasses.fields(node) if f.name not in ("nid", "span"))
        elif isinstance(node, list):
            stack.extend(node)
    return top
