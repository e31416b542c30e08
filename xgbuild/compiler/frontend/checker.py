"""The type checker: file-level declarations, function signatures, statements, flow facts.

Expressions are checked by `exprs.ExprChecker` and builtins by `builtins.BuiltinChecker`, mixed
into `FunctionChecker`. `ProgramChecker` runs one `FunctionChecker` per `def` and produces a
`TypedProgram`: the module plus side tables (node types, call instantiations, externals, shards)
that lowering reads.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import ast as A
from ..ops import sign as R
from .builtins import SPECS, BuiltinChecker
from .constants import ConstantEvaluator
from .codes import (BAD_CHAR, BAD_DECL, BAD_DIM, BAD_LOOP, BAD_NUM_GPU, COND_NOT_BOOL, DEFAULT_DTYPE, DUPLICATE, INDENT,
                    MAIN_PARAMS, MISSING_RETURN, NO_ENTRY, NO_MAIN, NOT_CALLABLE, OVERRIDE, RECURSION, RESULT_UNUSED,
                    RETURN_MISMATCH, SHARD_BAD, SHARD_CONFLICT, SHARD_INDIVISIBLE, SHARD_UNKNOWN, SYNTAX, TOO_DEEP,
                    TOO_LARGE, UNKNOWN_TARGET, UNKNOWN_TYPE, UNREACHABLE, UNUSED_VAR)
from .diagnostics import Diagnostics
from .exprs import UNIT, ExprChecker
from .loops import LoopChecker, fresh_copy, max_nid
from .scope import FuncSig, Scope, Var
from .precision import compute_policy
from .state import StatePlan, plan_state
from .source import SourceFile, Span
from .types import (DTYPES, ERROR, DimVar, DTypeVar, ErrorType, ExternVar, FloatLiteral, GradFn, IntLiteral,
                    ResultType, Subst, TensorType, TupleType, Type)

if TYPE_CHECKING:
    from ...hw import GpuProfile

MAX_NUM_GPU = 1 << 20


@dataclass(frozen=True)
class ShardSpec:
    function: str
    name: str               # the value sharded, or the region name for `shard("layer1")`
    dim: int | None
    span: Span
    region: bool = False


@dataclass
class TypedProgram:
    source: SourceFile
    module: A.Module
    funcs: dict[str, FuncSig]
    types: dict[int, Type]                       # node id -> resolved type
    instantiations: dict[int, dict[str, object]]  # call node id -> symbol -> dim
    externals: dict[str, TensorType]             # main's inputs, in first-use order
    constants: dict[str, object]
    target: str | None
    num_gpu: int
    shards: list[ShardSpec]
    main_ret: Type | None
    module_constants: dict = field(default_factory=dict)   # module (None: this file) -> constants
    # The target's profile as the checker loaded it (from `CheckOptions.hw_dir`); None without a
    # target. Handed on to the IR `Program` so the passes never load it again.
    profile: "GpuProfile | None" = field(default=None, compare=False, repr=False)
    # Each `for` loop's iterations (loops.py): statement id -> [(value of the variable, the block's copy)].
    unrolled: dict = field(default_factory=dict)
    consts: tuple = ()                               # the `--const` overrides applied (CheckOptions.consts)
    state: StatePlan = field(default_factory=StatePlan)  # training state fed back a step (state.py)
    compute: str | None = None                       # the products' dtype, `COMPUTE = ...` (precision.py)


@dataclass(frozen=True)
class CheckOptions:
    target: str | None = None       # --target, overriding TARGET_GPU
    num_gpu: int | None = None      # --num-gpu, overriding NUM_GPU
    lib: bool = False               # a library file: no `main` required
    hw_dir: object = None           # where GPU profiles live (None: built-in; commands pass Settings.hw_dir)
    entry: str = "main"             # --entry: the function the engine runs
    # --const NAME=VALUE: sorted (name, value) pairs overriding this file's constants
    # (constants.normalize makes them from a mapping).
    consts: tuple = ()


class FunctionChecker(LoopChecker, ExprChecker, BuiltinChecker):
    def __init__(self, prog: "ProgramChecker", fn: A.FuncDef, sig: FuncSig) -> None:
        self.prog = prog
        self.diags = prog.diags
        self.source = prog.diags.source
        self.funcs = prog.funcs
        self.constants = prog.constants_of(fn)
        self.calls = prog.calls
        self.instantiations = prog.instantiations
        self.fn, self.sig, self.current = fn, sig, fn.name
        self.subst = Subst(prog.counter)
        self.types: dict[int, Type] = {}
        self.signs: dict[int, R.Sign] = {}
        self.root_scope = Scope()
        self.locals: list[Var] = []
        self.shards: list[ShardSpec] = []
        self.is_main = fn.name == "main"
        self.allow_externs = self.is_main
        self.externs = prog.externs if self.is_main else {}
        self.assigned_later = _assigned_names(fn.body) if self.is_main else set()
        self.rigid_dims: set[str] = set()
        self.inferred_ret: Type | None = None
        self.shard_created: dict[str, Span] = {}
        self.active_shards: dict[str, int] = {}     # name -> dim, for the `with shard` blocks we are in
        self.call_nids: list[int] = []
        self.loop_spans: list[tuple[int, int]] = []  # the blocks of the loops unrolled here (loops.py)
        for name, (value, ty) in self.constants.items():
            self.root_scope.bind(Var(name, ty, Span(0, 0), "const", used=True), R.of_value(value)
                                 if isinstance(value, (int, float)) and not isinstance(value, bool) else R.ANY)
        if self.is_main:
            for var in prog.externs.values():
                self.root_scope.bind(var, R.ANY)
                self.rigid_dims.update(d for d in getattr(var.type, "shape", ()) if isinstance(d, str))
        for (pname, ptype), param in zip(sig.params, fn.params):
            var = Var(pname, ptype, param.span, "param")
            if isinstance(ptype, TensorType):
                self.rigid_dims.update(d for d in ptype.shape if isinstance(d, str))
            self.root_scope.bind(var, R.ANY)
            self.locals.append(var)
        self.scope = self.root_scope

    # --- driver ---------------------------------------------------------------------------------
    def run(self) -> None:
        terminates = self.block(self.fn.body)
        if self.sig.declared_ret and not terminates and self.sig.ret != UNIT and self.sig.ok \
                and not self.fn.syntax_errors:
            self.diags.error(MISSING_RETURN, self.fn.name_span, name=self.fn.name, expected=self.sig.ret)
        for spec in self.shards:
            self.check_shard(spec)
        # A definition in a loop's block is one Var per iteration, all at one span: judged together.
        sites: dict[object, list[Var]] = {}
        for var in self.locals:
            in_loop = any(lo <= var.span.start < hi for lo, hi in self.loop_spans)
            sites.setdefault((var.name, var.span.start, var.span.end) if in_loop else id(var), []).append(var)
        for copies in sites.values():
            var = next((v for v in copies if v.used), copies[-1])
            ty = self.subst.resolve(var.type)
            unhandled = next((v for v in copies if not v.handled), None)
            if isinstance(ty, ResultType) and unhandled is not None:
                var = unhandled
                self.diags.error(RESULT_UNUSED, var.span, detail=f"`{var.name}` holds a `{ty}` that is never handled",
                                 label="this `Result` is dropped",
                                 help=f"handle it: `match {var.name} {{ Ok(v) => ..., Err(e) => ... }}` or `{var.name}.unwrap_or(...)`")
            elif not var.used and var.kind == "local" and not var.name.startswith("_") and not self.fn.syntax_errors:
                self.diags.warning(UNUSED_VAR, var.span, name=var.name)
        if self.is_main:
            self.finish_externals()
        self.prog.shards.extend(self.shards)
        for nid in self.call_nids:
            self.prog.instantiations[nid] = {k: _dim_name(self.subst.dim(v)) for k, v in self.prog.instantiations[nid].items()}
        for nid, ty in self.types.items():
            self.prog.types[nid] = self.final(ty)
        self.prog.main_ret = self.final(self.inferred_ret or self.sig.ret) if self.is_main else self.prog.main_ret

    def final(self, ty: Type) -> Type:
        ty = self.subst.resolve(ty)
        if isinstance(ty, TensorType) and any(isinstance(d, DimVar) for d in ty.shape):
            # Dims no call solved (slices of symbolic dims) keep their descriptive names.
            ty = TensorType(ty.dtype, tuple(d.hint if isinstance(d, DimVar) else d for d in ty.shape))
        if isinstance(ty, ExternVar) and ty.name in self.externs:
            inner = self.externs[ty.name].type
            return ERROR if isinstance(inner, ExternVar) else self.subst.resolve(inner)
        if isinstance(ty, TupleType):
            return TupleType(tuple(self.final(t) for t in ty.items))
        return ty

    def finish_externals(self) -> None:
        taken = set(self.rigid_dims)
        for var in self.externs.values():
            ty = self.subst.resolve(var.type)
            if isinstance(ty, ExternVar) and var.name in self.shard_created:
                self.diags.error(SHARD_UNKNOWN, self.shard_created[var.name], name=var.name)
                var.type = ERROR
                continue
            if isinstance(ty, ExternVar) and self.diags.has_errors:
                var.type = ERROR     # most likely a consequence of an earlier error: stay quiet
                continue
            if isinstance(ty, ExternVar):
                self.diags.error(NOT_CALLABLE, var.span, detail=f"cannot infer the type of external `{var.name}`",
                                 help=f"declare it at file level: `extern Tensor[float32, M, N] {var.name}`")
                var.type = ERROR
                continue
            if isinstance(ty, TensorType) and isinstance(ty.dtype, DTypeVar):
                self.diags.warning(DEFAULT_DTYPE, var.span, name=var.name)
                self.subst.unify_dtype(ty.dtype, "float32")
            if isinstance(ty, TensorType):
                for i, d in enumerate(ty.shape):
                    d = self.subst.dim(d)
                    if isinstance(d, DimVar):
                        name = d.hint if d.hint.isidentifier() and d.hint not in taken else f"{var.name}_{i}"
                        while name in taken:
                            name += "_"
                        taken.add(name)
                        self.subst.dims[d.id] = name
            var.type = self.subst.resolve(ty)

    # --- statements -----------------------------------------------------------------------------
    def block(self, block: A.Block) -> bool:
        terminated = False
        for stmt in block.stmts:
            if terminated:
                self.diags.warning(UNREACHABLE, stmt.span)
                break
            terminated = getattr(self, "stmt_" + type(stmt).__name__)(stmt)
        return terminated

    def stmt_ExprStmt(self, s: A.ExprStmt) -> bool:
        ty, _ = self.check(s.expr)
        ty = self.deref(ty)
        if isinstance(ty, ResultType):
            self.diags.error(RESULT_UNUSED, s.expr.span, detail=f"unused `{ty}` that must be handled",
                             label="this `Result` is dropped",
                             help="handle it with `match`, or `.unwrap_or(default)` to use a fallback value")
        return False

    def stmt_Assign(self, s: A.Assign) -> bool:
        ty, sign = self.check(s.value)
        ty = self.deref(ty)
        if isinstance(s.value, A.Name) and isinstance(ty, ResultType):
            self.mark_handled(s.value)       # moved into the new name, which must be handled instead
        if s.destructure:
            if isinstance(ty, ErrorType):
                items: tuple = (ERROR,) * len(s.targets)
            elif not isinstance(ty, TupleType) or len(ty.items) != len(s.targets):
                self.diags.error(NOT_CALLABLE, s.value.span,
                                 detail=f"cannot destructure `{ty}` into {len(s.targets)} names")
                items = (ERROR,) * len(s.targets)
            else:
                items = ty.items
            for target, item in zip(s.targets, items):
                self.define(target, item, R.ANY)
            return False
        if ty == UNIT and isinstance(s.value, A.Call):
            self.diags.error(NOT_CALLABLE, s.value.span, detail=f"`{self.snippet(s.value)}` returns no value")
            ty = ERROR
        elif isinstance(ty, GradFn):
            self.diags.error(NOT_CALLABLE, s.value.span, detail="a gradient function must be called where it is made",
                             help="write `grad(f, wrt=x)(args...)`")
            ty = ERROR
        self.define(s.targets[0], ty, sign)
        return False

    def define(self, target: A.Name, ty: Type, sign: R.Sign) -> None:
        prev = self.scope.get(target.id)
        if prev is not None:
            pvar = prev[0]
            if pvar.kind == "loop":
                self.diags.error(BAD_LOOP, target.span, detail=f"cannot assign to the loop variable `{target.id}`",
                                 label="assigned in the loop", help="assign the value to another name")
                return
            if pvar.kind in ("const", "extern"):
                self.diags.error(DUPLICATE, target.span, name=target.id,
                                 label=f"`{target.id}` is a file-level {'constant' if pvar.kind == 'const' else 'external'}")
                return
            if isinstance(self.subst.resolve(pvar.type), ResultType) and not pvar.handled:
                self.diags.error(RESULT_UNUSED, pvar.span, detail=f"`{pvar.name}` holds a `Result` that is overwritten before it is handled",
                                 help=f"handle it with `match` or `.unwrap_or(...)` before reassigning `{pvar.name}`")
                pvar.handled = True
        var = Var(target.id, ty, target.span, "local")
        self.types[target.nid] = ty
        self.scope.bind(var, sign)
        self.locals.append(var)

    def stmt_Return(self, s: A.Return) -> bool:
        want = self.sig.ret if self.sig.declared_ret else self.inferred_ret
        if s.value is None:
            if want is not None and want != UNIT:
                self.diags.error(RETURN_MISMATCH, s.span, name=self.fn.name, found="nothing", expected=want)
            return True
        ty, _ = self.check(s.value, want)
        if isinstance(self.deref(ty), ResultType):
            self.mark_handled(s.value)
        if isinstance(s.value, A.TupleExpr):
            for item in s.value.items:
                self.mark_handled(item)
        if want is None:
            if isinstance(self.deref(ty), GradFn):
                self.diags.error(NOT_CALLABLE, s.value.span, detail="a gradient function must be called where it is made")
                ty = ERROR
            self.inferred_ret = self.default_literal(ty) if not isinstance(ty, TupleType) else \
                TupleType(tuple(self.default_literal(t) for t in ty.items))
            return True
        if self.sig.ok or not self.sig.declared_ret:
            self.accept(ty, want, s.value, code=RETURN_MISMATCH, name=self.fn.name)
        return True

    def stmt_If(self, s: A.If) -> bool:
        cty, _ = self.value(s.cond)
        if isinstance(cty, ExternVar):
            cty = self.bind_extern(cty, TensorType("bool", ()))
        if not isinstance(cty, ErrorType) and not (isinstance(cty, TensorType) and cty.dtype == "bool" and cty.rank == 0):
            self.diags.error(COND_NOT_BOOL, s.cond.span, found=self.default_literal(cty))
        then_facts, else_facts = self.guard_facts(s.cond)
        outer = self.scope
        self.scope = outer.copy()
        for name, fact in then_facts.items():
            self.scope.refine(name, R.meet_refine(self.scope.get(name)[1], fact))
        then_done = self.block(s.then)
        then_scope = self.scope
        self.scope = outer.copy()
        for name, fact in else_facts.items():
            self.scope.refine(name, R.meet_refine(self.scope.get(name)[1], fact))
        else_done = False
        if isinstance(s.orelse, A.Block):
            else_done = self.block(s.orelse)
        elif isinstance(s.orelse, A.If):
            else_done = self.stmt_If(s.orelse)
        else_scope = self.scope
        # The branches are overlays on `outer`; what goes on is written back into it.
        if then_done and else_done:
            self.scope = outer
        elif then_done:
            self.scope = outer.adopt(else_scope)
        elif else_done:
            self.scope = outer.adopt(then_scope)
        else:
            self.scope = self.merge(outer, then_scope, else_scope)
        return then_done and else_done

    def merge(self, outer: Scope, a: Scope, b: Scope) -> Scope:
        """Join two branches (overlays on `outer`) into `outer`: only names either one bound or
        refined can differ from `outer`."""
        for name in [*a.vars, *(n for n in b.vars if n not in a.vars)]:
            found_a, found_b = a.get(name), b.get(name)
            if found_a is None or found_b is None:
                continue
            (va, sa), (vb, sb) = found_a, found_b
            if va is vb:
                outer.bind(va, R.union(sa, sb))
                continue
            ta, tb = self.subst.resolve(va.type), self.subst.resolve(vb.type)
            if ta != tb:
                continue      # defined differently on the two paths: not usable after the `if`
            va.used = vb.used = True
            joined = Var(name, ta, va.span, "local", handled=va.handled and vb.handled)
            va.handled = vb.handled = True
            self.locals.append(joined)
            outer.bind(joined, R.union(sa, sb))
        return outer

    def guard_facts(self, cond: A.Expr) -> tuple[dict[str, R.Sign], dict[str, R.Sign]]:
        """What `cond` being true (then) or false (else) proves about scalar variables."""
        if isinstance(cond, A.Unary) and cond.op == "not":
            t, e = self.guard_facts(cond.operand)
            return e, t
        if isinstance(cond, A.Binary) and cond.op in ("and", "or"):
            lt, le = self.guard_facts(cond.left)
            rt, re = self.guard_facts(cond.right)
            if cond.op == "and":
                return _meet(lt, rt), {}
            return {}, _meet(le, re)
        if not isinstance(cond, A.Binary) or cond.op not in ("==", "!=", "<", "<=", ">", ">="):
            return {}, {}
        op, left, right = cond.op, cond.left, cond.right
        if not isinstance(left, A.Name):
            flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
            op, left, right = flipped, right, left
        if not (isinstance(left, A.Name) and self.is_scalar_var(left.id)):
            return {}, {}
        c = self.const_value(right)
        if c is None:
            return {}, {}
        name = left.id
        facts = {
            "==": (R.of_value(c), R.NONZERO if c == 0 else R.ANY),
            "!=": (R.NONZERO if c == 0 else R.ANY, R.of_value(c)),
            ">": (R.POS if c >= 0 else R.ANY, R.NONPOS if c <= 0 else R.ANY),
            ">=": (R.POS if c > 0 else R.NONNEG if c == 0 else R.ANY, R.NEG if c <= 0 else R.ANY),
            "<": (R.NEG if c <= 0 else R.ANY, R.NONNEG if c >= 0 else R.ANY),
            "<=": (R.NEG if c < 0 else R.NONPOS if c == 0 else R.ANY, R.POS if c >= 0 else R.ANY),
        }[op]
        return {name: facts[0]}, {name: facts[1]}

    def const_value(self, e: A.Expr) -> float | None:
        ty = self.types.get(e.nid)
        if isinstance(ty, (IntLiteral, FloatLiteral)):
            return ty.value
        return None

    def stmt_With(self, s: A.With) -> bool:
        seen: set[str] = set()
        for call in s.shards:
            bound = self.bind_builtin("shard", call)
            if bound is None:
                continue
            x = bound["x"]
            if isinstance(x, A.StrLit):
                self.shards.append(ShardSpec(self.fn.name, x.value, None, call.span, region=True))
                continue
            if not isinstance(x, A.Name):
                self.diags.error(SHARD_BAD, x.span, detail="`shard` takes the name of a value (or a region name in quotes)")
                continue
            if x.id in seen:
                self.diags.error(SHARD_BAD, call.span, detail=f"`{x.id}` is sharded twice in one `with`")
                continue
            seen.add(x.id)
            if self.scope.get(x.id) is None:
                if not (self.allow_externs and x.id not in self.assigned_later):
                    self.diags.error(SHARD_UNKNOWN, x.span, name=x.id)
                    continue
                self.shard_created[x.id] = x.span    # an external, if the block or later code uses it
            self.check(x)
            if bound["dim"] is None:
                self.diags.error(SHARD_BAD, call.span, detail=f"`shard({x.id})` needs a dimension: `shard({x.id}, dim=0)`")
                continue
            d = self.const_int(bound["dim"], "the sharded dimension")
            if d is not None:
                if self.active_shards.get(x.id, d) != d:
                    self.diags.error(SHARD_CONFLICT, call.span, name=x.id, first=self.active_shards[x.id], second=d,
                                     help=f"an enclosing `with` already splits `{x.id}` along dimension "
                                          f"{self.active_shards[x.id]}")
                    continue
                self.shards.append(ShardSpec(self.fn.name, x.id, d, call.span))
        outer = dict(self.active_shards)
        self.active_shards.update({sp.name: sp.dim for sp in self.shards if sp.span in
                                   {c.span for c in s.shards} and not sp.region})
        try:
            return self.block(s.body)
        finally:
            self.active_shards = outer

    def check_shard(self, spec: ShardSpec) -> None:
        if spec.region:
            return
        found = self.root_scope.get(spec.name) or self.scope.get(spec.name)
        ty = self.final(found[0].type) if found else ERROR
        if not isinstance(ty, TensorType):
            return
        if not -max(ty.rank, 1) <= spec.dim < max(ty.rank, 1) or ty.rank == 0:
            self.diags.error(BAD_DIM, spec.span, dim=spec.dim, rank=ty.rank)
            return
        size = ty.shape[spec.dim % ty.rank]
        n = self.prog.num_gpu
        if isinstance(size, int) and size % n != 0:
            self.diags.error(SHARD_INDIVISIBLE, spec.span, dim=spec.dim, name=spec.name, size=size, num_gpu=n,
                             help=f"`{spec.name}` is `{ty}`; shard a dimension divisible by {n}, or change `NUM_GPU`")


def _dim_name(d):
    return d.hint if isinstance(d, DimVar) else d


def _meet(a: dict[str, R.Sign], b: dict[str, R.Sign]) -> dict[str, R.Sign]:
    out = dict(a)
    for k, v in b.items():
        out[k] = (out[k] & v) or v if k in out else v
    return out


def _assigned_names(block: A.Block) -> set[str]:
    names: set[str] = set()
    stack: list[object] = [block]
    while stack:
        node = stack.pop()
        if isinstance(node, A.Block):
            stack.extend(node.stmts)
        elif isinstance(node, A.Assign):
            names.update(t.id for t in node.targets)
        elif isinstance(node, A.If):
            stack.append(node.then)
            if node.orelse is not None:
                stack.append(node.orelse)
        elif isinstance(node, A.With):
            stack.append(node.body)
        elif isinstance(node, A.For):
            names.add(node.var)
            stack.append(node.body)
    return names


class ProgramChecker:
    def __init__(self, diags: Diagnostics, options: CheckOptions) -> None:
        self.diags = diags
        self.options = options
        self.funcs: dict[str, FuncSig] = {}
        # File-level constants, per module: a module's functions see only its own constants
        # (None: the file being compiled).
        self.module_constants: dict[str | None, dict[str, tuple[object, Type]]] = {None: {}}
        self.externs: dict[str, Var] = {}
        self.calls: dict[str, set[str]] = {}
        self.instantiations: dict[int, dict] = {}
        self.types: dict[int, Type] = {}
        self.shards: list[ShardSpec] = []
        self.counter = [0]
        self.target: str | None = None
        self.profile: GpuProfile | None = None
        self.num_gpu = 1
        self.main_ret: Type | None = None
        self.constants_eval = ConstantEvaluator(diags, options.consts)
        self.unrolled: dict[int, list] = {}
        self.unrolled_count = 0
        self._last_nid: int | None = None      # loops.py: copies take ids past the parse's
        self.bad_dim_constants: set[str] = set()   # reported as dims once (resolve_type)

    def fresh_copy(self, block: A.Block) -> A.Block:
        """A copy of a loop's block with node ids no other node has (loops.py)."""
        if self._last_nid is None:
            self._last_nid = max_nid(self.module)

        def next_id() -> int:
            self._last_nid += 1
            return self._last_nid
        return fresh_copy(block, next_id)

    @property
    def constants(self) -> dict[str, tuple[object, Type]]:
        return self.module_constants[None]

    def constants_of(self, decl: A.Node) -> dict[str, tuple[object, Type]]:
        origin = getattr(decl, "origin", None)
        return self.module_constants.setdefault(origin.module if origin else None, {})

    def run(self, module: A.Module) -> TypedProgram:
        self.module = module
        target_decl: A.ConstDecl | None = None
        num_decl: A.ConstDecl | None = None
        compute_decl: A.ConstDecl | None = None
        defined: dict[str, Span] = {}
        for decl in module.decls:
            name = decl.name
            origin = getattr(decl, "origin", None)
            if isinstance(decl, A.ConstDecl) and origin is not None:
                self.constant(decl)          # scoped to its module: no clash with this file's names
                continue
            if name in defined:
                if origin is not None:
                    self.diags.error(DUPLICATE, origin.import_span, name=name,
                                     label=f"module `{origin.module}` defines `{name}` too")
                else:
                    self.diags.error(DUPLICATE, getattr(decl, "name_span", decl.span), name=name,
                                     label="defined again here")
                continue
            defined[name] = decl.span
            if isinstance(decl, A.ConstDecl):
                if name == "TARGET_GPU":
                    target_decl = decl
                elif name == "NUM_GPU":
                    num_decl = decl
                elif name == "COMPUTE":
                    compute_decl = decl
                else:
                    self.constant(decl)
            elif isinstance(decl, A.Extern):
                ty = self.resolve_type(decl.type)
                self.externs[name] = Var(name, ty, decl.span, "extern", used=True)
            else:
                if name in SPECS or name in ("Ok", "Err"):
                    self.diags.error(DUPLICATE, decl.name_span, name=name, label=f"`{name}` is a builtin",
                                     help="choose another name")
                    continue
                self.funcs[name] = self.signature(decl)
        self.hardware(target_decl, num_decl)
        compute = compute_policy(compute_decl, self.constants_eval, self.diags)
        self.constants_eval.unused(self.constants)
        entry = self.options.entry
        main = self.funcs.get(entry)
        # A syntax error may be the reason `main` was not seen (a broken `def main(` line): then the
        # syntax error is the one to fix, and "no `main`" would only mislead.
        syntax_errors = any(d.code in _SYNTAX_CODES and d.severity.value == "error" for d in self.diags.items)
        if main is None and not self.options.lib and not syntax_errors:
            if entry == "main":
                self.diags.error(NO_MAIN, Span(0, 0), path=self.diags.source.name,
                                 help="add an entry point: `def main() { ... }`")
            else:
                self.diags.error(NO_ENTRY, Span(0, 0), name=entry, path=self.diags.source.name,
                                 help=f"functions here: {', '.join(sorted(self.funcs)) or 'none'}")
        elif main is not None and main.params and entry == "main":
            self.diags.error(MAIN_PARAMS, main.node.name_span)
        for sig in self.funcs.values():
            if sig.node.origin is not None:
                # Checked clean on its own already; anything it reports here would point into
                # another file, so its (warning-only) diagnostics go to a sink of their own.
                own, self.diags = self.diags, Diagnostics(sig.node.origin.source)
                try:
                    FunctionChecker(self, sig.node, sig).run()
                finally:
                    self.diags = own
            else:
                FunctionChecker(self, sig.node, sig).run()
        self.recursion()
        state = plan_state(module, self.externs, self.main_ret, self.diags, entry)
        externals = {n: v.type for n, v in self.externs.items() if isinstance(v.type, TensorType)}
        return TypedProgram(self.diags.source, module, self.funcs, self.types, self.instantiations, externals,
                            {k: v for k, (v, _) in self.constants.items()}, self.target, self.num_gpu,
                            self.shards, self.main_ret,
                            {m: {k: v for k, (v, _) in table.items()} for m, table in self.module_constants.items()},
                            self.profile, self.unrolled, self.options.consts, state, compute)

    # --- file-level declarations ----------------------------------------------------------------
    def constant(self, decl: A.ConstDecl) -> None:
        """A file-level constant's value (constants.py), the compiled file's own overridable."""
        self.constants_eval.declare(decl, self.constants_of(decl), own=getattr(decl, "origin", None) is None)

    def hardware(self, target_decl: A.ConstDecl | None, num_decl: A.ConstDecl | None) -> None:
        from ...hw import UnknownTargetError, known_targets, load_profile

        name, span = None, Span(0, 0)
        if target_decl is not None:
            v = target_decl.value
            if isinstance(v, (A.Name, A.StrLit)):
                name, span = (v.id if isinstance(v, A.Name) else v.value), v.span
            else:
                self.diags.error(BAD_DECL, v.span, detail="`TARGET_GPU` takes a GPU name, e.g. `TARGET_GPU = H100`")
        if self.options.target is not None:
            if name is not None and name.lower() != self.options.target.lower():
                self.diags.note(OVERRIDE, span, detail=f"`TARGET_GPU = {name}` is overridden by `--target={self.options.target}`")
            name = self.options.target
        if name is not None:
            try:
                self.profile = load_profile(name, self.options.hw_dir)
                self.target = self.profile.name
            except UnknownTargetError:
                # A bad `--target` is refused before checking (target_option_error); here the source's.
                self.diags.error(UNKNOWN_TARGET, span, name=name, help=_targets_help(name, self.options.hw_dir))
        if num_decl is not None:
            v = num_decl.value
            if isinstance(v, A.IntLit) and 1 <= v.value <= MAX_NUM_GPU:
                self.num_gpu = v.value
            else:
                self.diags.error(BAD_NUM_GPU, v.span, value=self.diags.source.snippet(v.span)[:40])
        if self.options.num_gpu is not None:
            if num_decl is not None and self.options.num_gpu != self.num_gpu:
                self.diags.note(OVERRIDE, num_decl.span,
                                detail=f"`NUM_GPU = {self.num_gpu}` is overridden by `--num-gpu={self.options.num_gpu}`")
            self.num_gpu = self.options.num_gpu

    def signature(self, fn: A.FuncDef) -> FuncSig:
        params: list[tuple[str, Type]] = []
        seen: set[str] = set()
        ok = True
        constants = self.constants_of(fn)
        for p in fn.params:
            ty = self.resolve_type(p.type, constants)
            ok &= not isinstance(ty, ErrorType)
            if p.name in seen:
                self.diags.error(DUPLICATE, p.span, name=p.name, label="parameter named twice")
                ok = False
            seen.add(p.name)
            params.append((p.name, ty))
        ret = self.resolve_type(fn.ret, constants) if fn.ret is not None else (None if fn.name == "main" else UNIT)
        ok &= not isinstance(ret, ErrorType)
        return FuncSig(fn.name, tuple(params), ret if ret is not None else UNIT, fn, fn.ret is not None, ok)

    def resolve_type(self, t: A.TypeExpr, constants: dict | None = None) -> Type:
        constants = self.constants if constants is None else constants
        if isinstance(t, A.TypeName):
            if t.name in DTYPES:
                return TensorType(t.name, ())
            if t.name in ("Tensor", "Result"):
                self.diags.error(UNKNOWN_TYPE, t.span, name=t.name, help=f"`{t.name}` needs parameters: `{t.name}[...]`")
                return ERROR
            close = difflib.get_close_matches(t.name, DTYPES, n=1)
            self.diags.error(UNKNOWN_TYPE, t.span, name=t.name,
                             help=f"did you mean `{close[0]}`?" if close else f"scalar types: {', '.join(DTYPES)}")
            return ERROR
        if isinstance(t, A.TensorTypeExpr):
            if t.dtype.name not in DTYPES:
                return self.resolve_type(t.dtype, constants)
            dims: list = []
            for d in t.dims:
                if isinstance(d.value, str) and d.value in constants:
                    value = constants[d.value][0]
                    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                        # Once per constant: a model's size constant (`--const L=-1`) is in dozens of types.
                        if d.value not in self.bad_dim_constants:
                            self.bad_dim_constants.add(d.value)
                            self.diags.error(UNKNOWN_TYPE, d.span, name=d.value,
                                             help="a constant used as a dimension must be a non-negative integer")
                        return ERROR
                    dims.append(value)
                else:
                    dims.append(d.value)
            return TensorType(t.dtype.name, tuple(dims))
        if isinstance(t, A.ResultTypeExpr):
            inner = self.resolve_type(t.inner, constants)
            return ERROR if isinstance(inner, ErrorType) else ResultType(inner)
        items = tuple(self.resolve_type(i, constants) for i in t.items)
        return ERROR if any(isinstance(i, ErrorType) for i in items) else TupleType(items)

    def recursion(self) -> None:
        """Report call cycles, and call chains deeper than MAX_CALL_DEPTH, by a depth-first walk
        with its own stack (a chain of 10,000 functions is a 10,000-deep walk)."""
        state: dict[str, int] = {}       # 1: on the current path, 2: finished
        reported: set[str] = set()
        below: dict[str, int] = {}       # the longest chain of calls under each finished function
        for root in sorted(self.funcs):
            if root in state:
                continue
            path = [root]
            state[root] = 1
            todo = [iter(sorted(self.calls.get(root, ())))]
            while todo:
                callee = next(todo[-1], None)
                if callee is None:
                    todo.pop()
                    name = path.pop()
                    state[name] = 2
                    below[name] = 1 + max((below.get(c, 0) for c in self.calls.get(name, ())), default=0)
                    continue
                if state.get(callee) == 1 and callee not in reported:
                    cycle = path[path.index(callee):] + [callee]
                    reported.update(cycle)
                    self.diags.error(RECURSION, self.funcs[callee].node.name_span, name=callee,
                                     path=" -> ".join(f"`{c}`" for c in cycle))
                elif state.get(callee) is None and callee in self.funcs:
                    state[callee] = 1
                    path.append(callee)
                    todo.append(iter(sorted(self.calls.get(callee, ()))))
        deepest = max(self.funcs, key=lambda n: below.get(n, 0), default=None)
        if deepest is not None and below.get(deepest, 0) > MAX_CALL_DEPTH and not reported:
            node = self.funcs[deepest].node
            span = node.name_span if node.origin is None else node.origin.import_span
            self.diags.error(TOO_DEEP, span, what=f"calls from `{deepest}` nest", limit=f"{MAX_CALL_DEPTH:,}",
                             label=f"a chain of {below[deepest]:,} calls starts here",
                             help="XG inlines every call; flatten the chain into fewer functions")


MAX_CALL_DEPTH = 1000      # calls nested through functions; lowering inlines them all
_SYNTAX_CODES = frozenset({SYNTAX.code, BAD_CHAR.code, INDENT.code, TOO_DEEP.code, TOO_LARGE.code})


def _targets_help(name: str, hw_dir) -> str:
    from ...hw import known_targets
    known = known_targets(hw_dir)
    close = difflib.get_close_matches(name.upper(), known, n=1)
    return f"{f'did you mean `{close[0]}`? ' if close else ''}known targets: {', '.join(known)}"


def target_option_error(name: str | None, hw_dir, given_as: str = "--target"):
    """The CompileError for a target named outside the source (`--target`, `target=`) that no
    profile has, or None. It is the caller's mistake, not the source's: no line is underlined."""
    from ...hw import UnknownTargetError, load_profile
    from .diagnostics import plain_error
    if name is None:
        return None
    try:
        load_profile(name, hw_dir)
    except UnknownTargetError:
        return plain_error(UNKNOWN_TARGET, name=name, help=_targets_help(name, hw_dir),
                           notes=(f"the target was given as `{given_as}`",))
    return None
