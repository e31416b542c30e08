"""Expression checking: operators, literals, names, calls to user functions, indexing, `match`.

`ExprChecker` is mixed into the function checker (checker.py); builtins live in builtins.py.
Each `check` returns `(type, sign)`; the type of every node is recorded for later stages.
"""

from __future__ import annotations

import difflib
import math

from . import ast as A
from ..ops import BroadcastError, broadcast
from ..ops import sign as R
from .codes import (BAD_MATCH, BROADCAST, CONST_OVERFLOW, DIM_CONFLICT, DIV_UNSAFE, DTYPE_MISMATCH,
                    ERROR_OUTSIDE_RESULT, LITERAL_RANGE, MATMUL_SHAPE, NOT_CALLABLE, OUT_OF_BOUNDS, RANK,
                    RESULT_AS_VALUE, TYPE_MISMATCH, UNKNOWN_FUNC, UNKNOWN_NAME)
from .scope import FuncSig, Var
from .types import (DTYPES, ERROR, NAMED_ERRORS, Dim, DimVar, DTypeValue, DTypeVar, ErrorType,
                    ErrorValue, ExternVar, FloatLiteral, GradFn, IntLiteral, ResultType, ShapeValue,
                    StrType, TensorType, TupleType, Type, float_fits, fmt_shape, int_fits, is_float,
                    is_int)

Val = tuple[Type, R.Sign]
UNIT = TupleType(())
BOOL = TensorType("bool", ())
_ARITH = {"+", "-", "*", "/", "%"}
_COMPARE = {"==", "!=", "<", "<=", ">", ">="}


def expr_key(e: A.Expr | A.Slice | None) -> str:
    """A structural key: the language is pure, so equal keys mean equal values (for `x * x`)."""
    if e is None:
        return "_"
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, (A.IntLit, A.FloatLit)):
        return repr(e.value)
    if isinstance(e, A.Unary):
        return f"({e.op} {expr_key(e.operand)})"
    if isinstance(e, A.Binary):
        return f"({expr_key(e.left)} {e.op} {expr_key(e.right)})"
    if isinstance(e, A.Call):
        kw = ",".join(f"{k.name}={expr_key(k.value)}" for k in e.kwargs)
        return f"{expr_key(e.func)}({','.join(expr_key(a) for a in e.args)};{kw})"
    return f"#{e.nid}"    # anything else is never assumed equal to another node


# Keyword names other array libraries use for XG's (numpy/JAX `axis`, `keepdims`, ...).
KWARG_ALIASES = {"axis": "dim", "axes": "dim", "keepdims": "keepdim", "dims": "dim", "dimension": "dim",
                 "type": "dtype", "dt": "dtype"}


def kwarg_guess(name: str, allowed: list[str]) -> str | None:
    """The accepted keyword the user probably meant: a known alias, else the closest spelling."""
    alias = KWARG_ALIASES.get(name.lower())
    if alias in allowed:
        return alias
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return close[0] if close else None


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _truncating_div(a: int, b: int) -> int:
    """Integer division rounding toward zero, exactly (float division loses digits past 2**53)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


class ExprChecker:
    """Expression rules; expects the host class to provide diags, subst, scope, funcs, types …"""

    # --- entry ----------------------------------------------------------------------------------
    def check(self, e: A.Expr, expected: Type | None = None) -> Val:
        method = getattr(self, "check_" + type(e).__name__)
        ty, sign = method(e, expected)
        self.types[e.nid] = ty
        self.signs[e.nid] = sign
        return ty, sign

    def value(self, e: A.Expr, expected: Type | None = None) -> Val:
        """Check an expression whose value is used as data: a `Result` here is an error."""
        ty, sign = self.check(e, expected)
        ty = self.deref(ty)
        if isinstance(ty, ResultType):
            self.diags.error(RESULT_AS_VALUE, e.span, found=ty, inner=ty.inner,
                             label="this is a `Result`, not its value",
                             help=self.unwrap_help(e))
            self.mark_handled(e)
            return ERROR, R.ANY
        return ty, sign

    def deref(self, ty: Type) -> Type:
        return self.subst.resolve(ty)

    # --- literals and names ---------------------------------------------------------------------
    def check_IntLit(self, e: A.IntLit, expected: Type | None) -> Val:
        return IntLiteral(e.value), R.of_value(e.value)

    def check_FloatLit(self, e: A.FloatLit, expected: Type | None) -> Val:
        return FloatLiteral(e.value), R.of_value(e.value)

    def check_BoolLit(self, e: A.BoolLit, expected: Type | None) -> Val:
        return BOOL, R.ANY

    def check_StrLit(self, e: A.StrLit, expected: Type | None) -> Val:
        return StrType(), R.ANY

    def check_Name(self, e: A.Name, expected: Type | None) -> Val:
        found = self.scope.get(e.id)
        if found is not None:
            var, sign = found
            var.used = True
            return var.type, sign
        if e.id in DTYPES:
            return DTypeValue(e.id), R.ANY
        if e.id in NAMED_ERRORS:
            return ErrorValue(e.id), R.ANY
        if e.id in self.funcs or e.id in self.builtin_names():
            self.diags.error(NOT_CALLABLE, e.span, detail=f"`{e.id}` is a function, not a value",
                             label="call it: `" + e.id + "(...)`")
            return ERROR, R.ANY
        return self.unknown_name(e)

    def unknown_name(self, e: A.Name) -> Val:
        if self.allow_externs and e.id not in self.assigned_later:
            var = Var(e.id, ExternVar(e.id), e.span, "extern", used=True)
            self.externs[e.id] = var
            self.root_scope.bind(var, R.ANY)
            self.scope.bind(var, R.ANY)
            return var.type, R.ANY
        names = self.scope.names() + list(self.constants)
        close = difflib.get_close_matches(e.id, names, n=1)
        if e.id in self.assigned_later:
            hint = f"`{e.id}` is assigned later in `main`; move that assignment before this use"
        elif close:
            hint = f"a value with a similar name exists: `{close[0]}`"
        else:
            hint = "externals (engine inputs) are names used in `main`; other functions take values as parameters"
        self.diags.error(UNKNOWN_NAME, e.span, name=e.id, label="not found in this scope", help=hint)
        return ERROR, R.ANY

    # --- literal adaptation ---------------------------------------------------------------------
    def adapt(self, ty: Type, dtype: object, span) -> Type:
        """Give a literal the dtype its context needs; typed values are returned unchanged."""
        if isinstance(dtype, DTypeVar) and isinstance(ty, (IntLiteral, FloatLiteral)):
            # The context's dtype is still unknown (an external's): a float literal makes it a
            # float (float32 unless something else fixes it first); an integer literal waits.
            dtype = self.subst.dtype(dtype)
            if isinstance(dtype, DTypeVar):
                if isinstance(ty, FloatLiteral):
                    self.subst.unify_dtype(dtype, "float32")
                    return TensorType("float32", ())
                return TensorType(dtype, ())
        if isinstance(dtype, str) and isinstance(ty, (IntLiteral, FloatLiteral)):
            if isinstance(ty, IntLiteral) and dtype != "bool":
                if not int_fits(ty.value, dtype):
                    self.diags.error(LITERAL_RANGE, span, literal=ty.value, dtype=dtype)
                    return ERROR
                return TensorType(dtype, ())
            if isinstance(ty, FloatLiteral) and is_float(dtype):
                if not float_fits(ty.value, dtype):
                    self.diags.error(LITERAL_RANGE, span, literal=ty.value, dtype=dtype)
                    return ERROR
                return TensorType(dtype, ())
            self.diags.error(DTYPE_MISMATCH, span, left=ty, op="as", right=dtype,
                             label=f"a {ty} cannot become `{dtype}`",
                             help=f"write a literal of the right kind, or `cast(..., {dtype})`")
            return ERROR
        return ty

    def default_literal(self, ty: Type) -> Type:
        if isinstance(ty, IntLiteral):
            return TensorType("int64", ())
        if isinstance(ty, FloatLiteral):
            return TensorType("float32", ())
        return ty

    # --- externals ------------------------------------------------------------------------------
    def bind_extern(self, ty: ExternVar, like: Type) -> Type:
        var = self.externs[ty.name]
        var.type = like
        return like

    def extern_like(self, ext: ExternVar, other: Type, span) -> Type:
        """An external used beside a tensor: same dtype and rank, dims unified with it."""
        if isinstance(other, TensorType):
            dims = tuple(self.subst.fresh_dim(f"{ext.name}.{i}") for i in range(other.rank))
            return self.bind_extern(ext, TensorType(other.dtype, dims))
        if isinstance(other, (IntLiteral, FloatLiteral)):
            dtype = "int64" if isinstance(other, IntLiteral) else self.subst.fresh_dtype()
            return self.bind_extern(ext, TensorType(dtype, ()))
        return self.cannot_infer(ext, span)

    def cannot_infer(self, ext: ExternVar, span) -> Type:
        self.diags.error(NOT_CALLABLE, span, detail=f"cannot infer the type of external `{ext.name}` from this use",
                         help=f"declare it at file level: `extern Tensor[float32, M, N] {ext.name}`")
        self.bind_extern(ext, ERROR)
        return ERROR

    # --- operators ------------------------------------------------------------------------------
    def check_Unary(self, e: A.Unary, expected: Type | None) -> Val:
        ty, sign = self.value(e.operand)
        if isinstance(ty, ErrorType):
            return ERROR, R.ANY
        if e.op == "not":
            ty = ty if not isinstance(ty, ExternVar) else self.bind_extern(ty, BOOL)
            if not (isinstance(ty, TensorType) and ty.dtype == "bool"):
                self.diags.error(TYPE_MISMATCH, e.operand.span, expected="bool", found=ty)
                return ERROR, R.ANY
            return ty, R.ANY
        if isinstance(ty, IntLiteral):
            if e.op == "-" and -ty.value > _INT64_MAX:      # `-(-9223372036854775808)`
                self.diags.error(CONST_OVERFLOW, e.span, detail=f"constant `{self.snippet(e)}` overflows `int64`",
                                 help="integer constants are `int64`: -9223372036854775808 to 9223372036854775807")
                return ERROR, R.ANY
            return IntLiteral(-ty.value if e.op == "-" else ty.value), R.neg(sign) if e.op == "-" else sign
        if isinstance(ty, FloatLiteral):
            return FloatLiteral(-ty.value if e.op == "-" else ty.value), R.neg(sign) if e.op == "-" else sign
        if isinstance(ty, ExternVar):
            return self.cannot_infer(ty, e.operand.span), R.ANY
        if not isinstance(ty, TensorType) or ty.dtype == "bool" or ty.dtype == "uint8" and e.op == "-":
            self.diags.error(NOT_CALLABLE, e.span, detail=f"unary `{e.op}` cannot be applied to `{ty}`")
            return ERROR, R.ANY
        return ty, (R.neg(sign) if e.op == "-" else sign)

    def check_Binary(self, e: A.Binary, expected: Type | None) -> Val:
        if e.op == "@":
            return self.matmul(e)
        lt, ls = self.value(e.left)
        rt, rs = self.value(e.right)
        if isinstance(lt, ErrorType) or isinstance(rt, ErrorType):
            return ERROR, R.ANY
        for ty, side in ((lt, e.left), (rt, e.right)):
            if not isinstance(ty, (TensorType, IntLiteral, FloatLiteral, ExternVar)):
                self.diags.error(NOT_CALLABLE, side.span, detail=f"operator `{e.op}` cannot be applied to {ty}")
                return ERROR, R.ANY
        if isinstance(lt, ExternVar):
            lt = self.extern_like(lt, rt, e.left.span) if not isinstance(rt, ExternVar) else self.cannot_infer(lt, e.left.span)
        if isinstance(rt, ExternVar):
            rt = self.extern_like(rt, lt, e.right.span)
        if isinstance(lt, ErrorType) or isinstance(rt, ErrorType):
            return ERROR, R.ANY
        if e.op in ("and", "or"):
            return self.logical(e, lt, rt)
        lit = isinstance(lt, (IntLiteral, FloatLiteral)), isinstance(rt, (IntLiteral, FloatLiteral))
        if lit == (True, True):
            return self.fold(e, lt, rt, rs)
        if lit[0]:
            lt = self.adapt(lt, rt.dtype, e.left.span)
        elif lit[1]:
            rt = self.adapt(rt, lt.dtype, e.right.span)
        if isinstance(lt, ErrorType) or isinstance(rt, ErrorType):
            return ERROR, R.ANY
        if not self.subst.unify_dtype(lt.dtype, rt.dtype):
            self.diags.error(DTYPE_MISMATCH, e.op_span, left=self.subst.dtype(lt.dtype), op=e.op,
                             right=self.subst.dtype(rt.dtype),
                             label=f"`{self.subst.dtype(lt.dtype)}` and `{self.subst.dtype(rt.dtype)}` cannot be combined without a cast",
                             help=f"convert one side explicitly, e.g. `cast({self.snippet(e.right)}, {self.subst.dtype(lt.dtype)})`")
            return ERROR, R.ANY
        dtype = self.subst.dtype(lt.dtype)
        shape = self.broadcast(lt, rt, e)
        if shape is None:
            return ERROR, R.ANY
        if e.op in _COMPARE:
            return TensorType("bool", shape), R.ANY
        if dtype == "bool":
            self.diags.error(NOT_CALLABLE, e.op_span, detail=f"operator `{e.op}` cannot be applied to `bool` values",
                             help=f"use `and`, `or`, `not`, or `cast({self.snippet(e.left)}, int32)` first")
            return ERROR, R.ANY
        if e.op in ("/", "%"):
            self.check_divisor(e.right, rs)
        return TensorType(dtype, shape), self.arith_sign(e, ls, rs)

    def arith_sign(self, e: A.Binary, ls: R.Sign, rs: R.Sign) -> R.Sign:
        if e.op == "+":
            return R.add(ls, rs)
        if e.op == "-":
            return R.sub(ls, rs)
        if e.op == "*":
            return R.square(ls) if expr_key(e.left) == expr_key(e.right) else R.mul(ls, rs)
        if e.op == "/":
            return R.mul(ls, rs)
        return R.ANY

    def fold(self, e: A.Binary, lt: Type, rt: Type, rs: R.Sign) -> Val:
        a, b = lt.value, rt.value  # type: ignore[union-attr]
        if e.op in ("/", "%") and b == 0:
            self.check_divisor(e.right, rs)
            return ERROR, R.ANY
        both_int = isinstance(lt, IntLiteral) and isinstance(rt, IntLiteral)
        if e.op in _COMPARE:
            return BOOL, R.ANY
        if e.op == "+":
            v = a + b
        elif e.op == "-":
            v = a - b
        elif e.op == "*":
            v = a * b
        elif e.op == "/":
            v = _truncating_div(a, b) if both_int else a / b
        else:
            v = a - b * _truncating_div(a, b) if both_int else math.fmod(a, b)
        # Literal arithmetic is exact; its result must still be a value of the literal's type.
        if both_int and not _INT64_MIN <= v <= _INT64_MAX:
            self.diags.error(CONST_OVERFLOW, e.span, detail=f"constant `{self.snippet(e)}` overflows `int64`",
                             label=f"this is {v if abs(v) < 10 ** 30 else 'beyond 1e30'}",
                             help="integer constants are `int64`: -9223372036854775808 to 9223372036854775807")
            return ERROR, R.ANY
        if not both_int and not math.isfinite(v):
            self.diags.error(CONST_OVERFLOW, e.span, detail=f"constant `{self.snippet(e)}` is not a finite `float64`",
                             label="this is infinite", help="float constants must be finite (at most about 1.8e308)")
            return ERROR, R.ANY
        if both_int:
            return IntLiteral(int(v)), R.of_value(v)
        return FloatLiteral(float(v)), R.of_value(v)

    def logical(self, e: A.Binary, lt: Type, rt: Type) -> Val:
        for ty, side in ((lt, e.left), (rt, e.right)):
            if not (isinstance(ty, TensorType) and ty.dtype == "bool"):
                self.diags.error(TYPE_MISMATCH, side.span, expected="bool", found=ty,
                                 label=f"`{e.op}` needs `bool` operands")
                return ERROR, R.ANY
        shape = self.broadcast(lt, rt, e)
        return (TensorType("bool", shape), R.ANY) if shape is not None else (ERROR, R.ANY)

    def broadcast(self, lt: TensorType, rt: TensorType, e: A.Node) -> tuple[Dim, ...] | None:
        """The broadcast shape (compiler/ops' rule), unifying symbolic dims that must be equal."""
        a = tuple(self.subst.dim(d) for d in lt.shape)
        b = tuple(self.subst.dim(d) for d in rt.shape)
        try:
            return broadcast(a, b, lambda x, y: self.subst.dim(x) if self.subst.unify_dim(x, y) else None)
        except BroadcastError as exc:
            self.diags.error(BROADCAST, getattr(e, "op_span", e.span), left=fmt_shape(a), right=fmt_shape(b),
                             label=f"dimension {exc.x} cannot be combined with {exc.y}",
                             help="shapes combine when equal, or the shorter one matches the trailing dims, or a dim is 1")
            return None

    def check_divisor(self, divisor: A.Expr, sign: R.Sign) -> None:
        if R.nonzero(sign):
            return
        text = self.snippet(divisor)
        if isinstance(divisor, A.Name) and self.is_scalar_var(divisor.id):
            help = self.guard_help(divisor.id)
        elif isinstance(divisor, (A.IntLit, A.FloatLit)):
            help = "dividing by a zero constant is never valid"
        else:
            help = ("divide by something provably nonzero: a guarded scalar, or a positive value such as "
                    "`exp(...)`, `softmax(...)`, `x * x + eps`, or a sum of positives")
        self.diags.error(DIV_UNSAFE, divisor.span, divisor=text, label="this divisor may be zero", help=help)

    def guard_help(self, name: str) -> str:
        """How to guard a scalar divisor in this function: returning an error only where the
        function returns a `Result` (anywhere else that is XG0403)."""
        ret = self.deref(self.sig.ret) if self.sig.declared_ret else None
        if isinstance(ret, ResultType):
            return f"guard it first: `if {name} == 0 {{ return DivByZero }}`"
        inside = f"divide inside `if {name} != 0 {{ ... }}` (or return early from `if {name} == 0 {{ ... }}`)"
        if ret is None or self.is_main:
            return inside
        return (f"{inside}; to report the error instead, declare `{self.fn.name}` to return "
                f"`Result[{ret}]` and guard with `if {name} == 0 {{ return DivByZero }}`")

    def is_scalar_var(self, name: str) -> bool:
        found = self.scope.get(name)
        return found is not None and isinstance(found[0].type, TensorType) and found[0].type.rank == 0

    # --- matmul ---------------------------------------------------------------------------------
    def matmul(self, e: A.Binary) -> Val:
        lt, _ = self.value(e.left)
        rt, _ = self.value(e.right)
        if isinstance(lt, ExternVar) and isinstance(rt, ExternVar):
            dtype = self.subst.fresh_dtype()
            lt = self.bind_extern(lt, TensorType(dtype, (self.subst.fresh_dim(f"{lt.name}.0"), self.subst.fresh_dim(f"{lt.name}.1"))))
        if isinstance(lt, ExternVar):
            lt = self.extern_like(lt, rt if isinstance(rt, TensorType) and rt.rank >= 2 else ERROR, e.left.span)
        if isinstance(rt, ExternVar):
            other = lt if isinstance(lt, TensorType) and lt.rank >= 2 else ERROR
            rt = self.extern_like(rt, other, e.right.span)
        if isinstance(lt, ErrorType) or isinstance(rt, ErrorType):
            return ERROR, R.ANY
        for ty, side in ((lt, e.left), (rt, e.right)):
            if not isinstance(ty, TensorType) or ty.rank == 0:
                self.diags.error(RANK, side.span, detail=f"`@` needs tensors of rank >= 1, found `{ty}`")
                return ERROR, R.ANY
        if not self.subst.unify_dtype(lt.dtype, rt.dtype):
            self.diags.error(DTYPE_MISMATCH, e.op_span, left=lt.dtype, op="@", right=rt.dtype,
                             label="both operands of `@` need the same dtype",
                             help=f"convert one side explicitly, e.g. `cast({self.snippet(e.right)}, {lt.dtype})`")
            return ERROR, R.ANY
        if self.subst.dtype(lt.dtype) == "bool":
            self.diags.error(NOT_CALLABLE, e.op_span, detail="operator `@` cannot be applied to `bool` values",
                             help=f"cast both operands first, e.g. `cast({self.snippet(e.left)}, int32)`")
            return ERROR, R.ANY
        a, b = lt.shape, rt.shape
        ka = a[-1]
        kb = b[-2] if len(b) >= 2 else b[0]
        if not self.subst.unify_dim(ka, kb):
            self.diags.error(MATMUL_SHAPE, e.op_span, left=fmt_shape(a), right=fmt_shape(b),
                             label=f"{self.subst.dim(ka)} (columns of the left) != {self.subst.dim(kb)} (rows of the right)",
                             help="the left operand's last dim must equal the right operand's second-to-last; "
                                  f"`transpose({self.snippet(e.right)})` swaps the last two dims of the right")
            return ERROR, R.ANY
        batch_a, batch_b = a[:-2], b[:-2]
        batch: tuple[Dim, ...] = ()
        if batch_a or batch_b:
            shape = self.broadcast(TensorType(lt.dtype, batch_a), TensorType(rt.dtype, batch_b), e)
            if shape is None:
                return ERROR, R.ANY
            batch = shape
        out = batch + (a[-2:-1] if len(a) >= 2 else ()) + (b[-1:] if len(b) >= 2 else ())
        return TensorType(self.subst.dtype(lt.dtype), tuple(self.subst.dim(d) for d in out)), R.ANY

    # --- accepting a value where a type is required ---------------------------------------------
    def accept(self, ty: Type, want: Type, node: A.Node, *, code=TYPE_MISMATCH, **fmt) -> bool:
        """Check `ty` against `want`, binding externals and dim variables; report a mismatch."""
        raw_want = want                  # unresolved: its DimVars name the symbol (`K`) in messages
        ty, want = self.deref(ty), self.deref(want)
        if isinstance(ty, ErrorType) or isinstance(want, ErrorType):
            return True
        if isinstance(ty, ExternVar):
            self.bind_extern(ty, want)
            return True
        if isinstance(want, TensorType) and want.rank == 0 and isinstance(ty, (IntLiteral, FloatLiteral)):
            return not isinstance(self.adapt(ty, self.subst.dtype(want.dtype), node.span), ErrorType)
        if isinstance(want, ResultType) and isinstance(ty, ErrorValue):
            return True
        if isinstance(want, ResultType) and isinstance(ty, ResultType):
            return self.accept(ty.inner, want.inner, node, code=code, **fmt)
        if isinstance(want, TupleType) and isinstance(ty, TupleType) and len(want.items) == len(ty.items):
            return all(self.accept(t, w, node, code=code, **fmt) for t, w in zip(ty.items, want.items))
        if isinstance(want, TensorType) and isinstance(ty, TensorType) and ty.rank == want.rank:
            if self.subst.unify_dtype(ty.dtype, want.dtype):
                hints = raw_want.shape if isinstance(raw_want, TensorType) and raw_want.rank == want.rank else want.shape
                for got, need in zip(ty.shape, hints):
                    before = self.subst.dim(need)
                    if not self.subst.unify_dim(got, need):
                        if isinstance(need, DimVar) and not isinstance(before, DimVar):
                            self.diags.error(DIM_CONFLICT, node.span, name=need.hint, first=self.subst.dim(got),
                                             second=before, label=f"`{need.hint}` must be {before} here")
                            return False
                        break
                else:
                    return True
        self.report_mismatch(ty, want, node, code, **fmt)
        return False

    def report_mismatch(self, ty: Type, want: Type, node: A.Node, code, **fmt) -> None:
        ty, want = self.deref(self.default_literal(ty)), self.deref(want)
        if isinstance(ty, ResultType) and not isinstance(want, ResultType):
            self.diags.error(RESULT_AS_VALUE, node.span, found=ty, inner=ty.inner,
                             label="this is a `Result`, not its value",
                             help=self.unwrap_help(node))
            return
        if isinstance(want, ResultType) and not isinstance(ty, (ResultType, ErrorValue)):
            self.diags.error(code, node.span, expected=want, found=ty, **fmt,
                             help=f"wrap the value: `Ok({self.snippet(node)})`")
            return
        if isinstance(ty, ErrorValue):
            self.diags.error(ERROR_OUTSIDE_RESULT, node.span,
                             detail=f"`{ty.name}` is an error, but `{want}` is not a `Result`",
                             help=f"declare the function `-> Result[{want}]` to return errors")
            return
        help = ""
        if isinstance(ty, TensorType) and isinstance(want, TensorType) and ty.shape == want.shape \
                and ty.dtype != want.dtype:
            help = f"convert explicitly: `cast({self.snippet(node)}, {want.dtype})`"
        self.diags.error(code, node.span, expected=want, found=ty, help=help, **fmt)

    # --- calls to user functions ----------------------------------------------------------------
    def call_user(self, sig: FuncSig, e: A.Call) -> Val:
        self.calls.setdefault(self.current, set()).add(sig.name)
        args = self.bind_user_args(sig, e)
        if args is None:
            return ERROR, R.ANY
        mapping: dict[str, DimVar] = {}
        ok = sig.ok
        for (pname, ptype), arg in zip(sig.params, args):
            want = self.subst.instantiate(ptype, mapping)
            ty, _ = self.check(arg, want)
            if isinstance(self.deref(ty), ResultType):
                self.mark_handled(arg)
            ok &= self.accept(ty, want, arg)
        self.instantiations[e.nid] = dict(mapping)
        self.call_nids.append(e.nid)
        if not ok:
            return ERROR, R.ANY
        return self.deref(self.subst.instantiate(sig.ret, mapping)), R.ANY

    def bind_user_args(self, sig: FuncSig, e: A.Call) -> list[A.Expr] | None:
        names = [p for p, _ in sig.params]
        args: list[A.Expr | None] = list(e.args) + [None] * max(0, len(names) - len(e.args))
        if len(e.args) > len(names):
            self.arity_error(sig.name, len(names), len(e.args), e)
            return None
        for kw in e.kwargs:
            if kw.name not in names:
                self.bad_kwarg(kw, f"`{sig.name}` has no parameter `{kw.name}`", names)
                return None
            i = names.index(kw.name)
            if args[i] is not None:
                self.bad_kwarg(kw, f"argument `{kw.name}` is given twice", names)
                return None
            args[i] = kw.value
        if any(a is None for a in args):
            self.arity_error(sig.name, len(names), sum(a is not None for a in args), e)
            return None
        return args  # type: ignore[return-value]

    def arity_error(self, name: str, expected: int, found: int, e: A.Node) -> None:
        from .codes import ARITY
        self.diags.error(ARITY, e.span, name=name, expected=expected, s="" if expected == 1 else "s",
                         found=found, were="was" if found == 1 else "were")

    def bad_kwarg(self, kw: A.Keyword, detail: str, allowed) -> None:
        from .codes import BAD_KWARG
        allowed = list(allowed)
        listed = ", ".join(f"`{a}`" for a in allowed) or "none"
        guess = kwarg_guess(kw.name, allowed)
        hint = f"did you mean `{guess}`? " if guess and guess != kw.name else ""
        self.diags.error(BAD_KWARG, kw.span, detail=detail, help=f"{hint}accepted: {listed}")

    def check_Call(self, e: A.Call, expected: Type | None) -> Val:
        if isinstance(e.func, A.Call):
            fty, _ = self.check(e.func)
            if isinstance(fty, GradFn):
                return self.call_grad(fty, e)
            if not isinstance(fty, ErrorType):
                self.diags.error(NOT_CALLABLE, e.func.span, detail=f"{fty} is not callable")
            return ERROR, R.ANY
        if not isinstance(e.func, A.Name):
            self.diags.error(NOT_CALLABLE, e.func.span, detail="only named functions can be called")
            return ERROR, R.ANY
        name = e.func.id
        if name in ("Ok", "Err"):
            return self.result_ctor(e, expected)
        if name in self.funcs:
            return self.call_user(self.funcs[name], e)
        if name in self.builtin_names():
            return self.call_builtin(name, e)
        if self.scope.get(name) is not None:
            self.diags.error(NOT_CALLABLE, e.func.span, detail=f"`{name}` is a value, not a function")
            return ERROR, R.ANY
        known = list(self.funcs) + list(self.builtin_names())
        close = difflib.get_close_matches(name, known, n=1)
        self.diags.error(UNKNOWN_FUNC, e.func.span, name=name, label="not a function defined here or a builtin",
                         help=f"did you mean `{close[0]}`?" if close else "define it with `def` in this file")
        for arg in e.args:   # still check the arguments, for their own errors
            self.check(arg)
        return ERROR, R.ANY

    def result_ctor(self, e: A.Call, expected: Type | None) -> Val:
        name = e.func.id  # type: ignore[union-attr]
        if len(e.args) != 1 or e.kwargs:
            self.arity_error(name, 1, len(e.args) + len(e.kwargs), e)
            return ERROR, R.ANY
        want = self.deref(expected) if expected is not None else None
        if name == "Err":
            ty, _ = self.check(e.args[0])
            if not isinstance(ty, (ErrorValue, ErrorType)):
                self.diags.error(ERROR_OUTSIDE_RESULT, e.args[0].span, detail="`Err(...)` takes a named error",
                                 help="e.g. `Err(DivByZero)`; or return the named error directly")
                return ERROR, R.ANY
            return ty, R.ANY
        inner_want = want.inner if isinstance(want, ResultType) else None
        ty, _ = self.value(e.args[0], inner_want)
        if inner_want is not None:
            if not self.accept(ty, inner_want, e.args[0]):
                return ERROR, R.ANY
            return want, R.ANY
        return ResultType(self.default_literal(ty)), R.ANY

    # --- methods, indexing, match ---------------------------------------------------------------
    def check_MethodCall(self, e: A.MethodCall, expected: Type | None) -> Val:
        ty, _ = self.check(e.obj)
        ty = self.deref(ty)
        if isinstance(ty, ErrorType):
            return ERROR, R.ANY
        if e.method != "unwrap_or":
            self.diags.error(NOT_CALLABLE, e.method_span, detail=f"no method `{e.method}`",
                             help="the only method is `Result.unwrap_or(default)`")
            return ERROR, R.ANY
        if not isinstance(ty, ResultType):
            self.diags.error(NOT_CALLABLE, e.method_span, detail=f"`unwrap_or` is a method of `Result`, not of `{ty}`")
            return ERROR, R.ANY
        self.mark_handled(e.obj)
        if len(e.args) != 1 or e.kwargs:
            self.arity_error("unwrap_or", 1, len(e.args) + len(e.kwargs), e)
            return ERROR, R.ANY
        dty, dsign = self.value(e.args[0], ty.inner)
        if not self.accept(dty, ty.inner, e.args[0]):
            return ERROR, R.ANY
        return ty.inner, R.ANY

    def mark_handled(self, e: A.Expr) -> None:
        if isinstance(e, A.Name):
            found = self.scope.get(e.id)
            if found is not None:
                found[0].handled = True

    def check_Match(self, e: A.Match, expected: Type | None) -> Val:
        ty, _ = self.check(e.scrutinee)
        ty = self.deref(ty)
        if isinstance(ty, ErrorType):
            return ERROR, R.ANY
        if not isinstance(ty, ResultType):
            self.diags.error(BAD_MATCH, e.scrutinee.span, detail=f"`match` takes a `Result`, found `{ty}`")
            return ERROR, R.ANY
        self.mark_handled(e.scrutinee)
        seen: set[str] = set()
        result: Type | None = expected
        out_sign: R.Sign | None = None
        for arm in e.arms:
            p = arm.pattern
            outer = self.scope
            self.scope = outer.copy()
            if p.ctor in seen or "_" in seen or ("Err" in seen and p.ctor in NAMED_ERRORS):
                self.diags.error(BAD_MATCH, p.span, detail="unreachable pattern: an earlier arm covers it")
            seen.add(p.ctor)
            if p.ctor == "Ok":
                if p.binding:
                    self.scope.bind(Var(p.binding, ty.inner, p.binding_span or p.span, "binding", used=True), R.ANY)
            elif p.ctor == "Err":
                if p.binding:
                    self.scope.bind(Var(p.binding, ErrorValue("Err"), p.binding_span or p.span, "binding", used=True), R.ANY)
            elif p.ctor in NAMED_ERRORS or p.ctor == "_":
                if p.binding:
                    self.diags.error(BAD_MATCH, p.span, detail=f"`{p.ctor}` binds no value")
            else:
                self.diags.error(BAD_MATCH, p.span, detail=f"unknown pattern `{p.ctor}`",
                                 help="patterns are `Ok(v)`, `Err(e)`, a named error such as `DivByZero`, or `_`")
            bty, bsign = self.value(arm.body, result)
            self.scope = outer
            if isinstance(bty, ErrorType):
                result = result or ERROR
                continue
            if result is None or isinstance(self.deref(result), (IntLiteral, FloatLiteral)) and isinstance(bty, TensorType):
                if result is not None and not self.accept(result, bty, arm.body):
                    continue
                result = bty
                out_sign = bsign if out_sign is None else R.union(out_sign, bsign)
            elif self.accept(bty, result, arm.body):
                out_sign = bsign if out_sign is None else R.union(out_sign, bsign)
        if "Ok" not in seen or not ({"Err", "_"} & seen):
            missing = "`Ok(v)`" if "Ok" not in seen else "`Err(e)`"
            self.diags.error(BAD_MATCH, e.span, detail=f"non-exhaustive `match`: no arm for {missing}",
                             help="a `match` on a `Result` needs an `Ok(v)` arm and an `Err(e)` (or `_`) arm")
            return ERROR, R.ANY
        return (result if result is not None else ERROR), (out_sign or R.ANY)

    def check_Index(self, e: A.Index, expected: Type | None) -> Val:
        ty, sign = self.value(e.base)
        if isinstance(ty, ExternVar):
            ty = self.cannot_infer(ty, e.base.span)
        if isinstance(ty, ErrorType):
            for item in e.items:
                if not isinstance(item, A.Slice):
                    self.check(item)
            return ERROR, R.ANY
        if not isinstance(ty, TensorType) or ty.rank == 0:
            self.diags.error(NOT_CALLABLE, e.base.span, detail=f"`{ty}` cannot be indexed")
            return ERROR, R.ANY
        if len(e.items) > ty.rank:
            self.diags.error(RANK, e.span, detail=f"{len(e.items)} indices for a tensor of rank {ty.rank}",
                             help=f"`{self.snippet(e.base)}` is `{ty}`")
            return ERROR, R.ANY
        out: list[Dim] = []
        ok = True
        for axis, item in enumerate(e.items):
            size = self.subst.dim(ty.shape[axis])
            if isinstance(item, A.Slice):
                bounds = [self.index_value(b, axis, size, slice_bound=True) if b is not None else None
                          for b in (item.lo, item.hi, item.step)]
                if any(b is False for b in bounds):
                    ok = False
                    continue
                out.append(self.slice_size(size, *bounds))
            else:
                value = self.index_value(item, axis, size, slice_bound=False)
                ok &= value is not False
        if not ok:
            return ERROR, R.ANY
        out.extend(ty.shape[len(e.items):])
        return TensorType(ty.dtype, tuple(out)), sign

    def index_value(self, item: A.Expr, axis: int, size: Dim, slice_bound: bool):
        """Check one index (or slice bound); returns its constant value, None if unknown, False on error."""
        ty, _ = self.value(item)
        if isinstance(ty, ErrorType):
            return False
        if isinstance(ty, IntLiteral):
            v = ty.value
            if isinstance(size, int):
                lo, hi = (-size, size) if slice_bound else (-size, size - 1)
                if not lo <= v <= hi:
                    self.diags.error(OUT_OF_BOUNDS, item.span, index=v, dim=axis, size=size,
                                     label=f"valid {'bounds' if slice_bound else 'indices'} are {lo}..{hi}")
                    return False
            return v
        if isinstance(ty, TensorType) and ty.rank == 0 and is_int(self.subst.dtype(ty.dtype)):
            return None
        self.diags.error(TYPE_MISMATCH, item.span, expected="an integer index", found=ty)
        return False

    def slice_size(self, size: Dim, lo, hi, step) -> Dim:
        if isinstance(size, int) and all(isinstance(b, int) or b is None for b in (lo, hi, step)):
            if step == 0:
                return 0
            return len(range(size)[slice(lo, hi, step)])
        if lo is None and hi is None and step in (None, 1):
            return size
        return self.subst.fresh_dim(f"{size}[{lo if lo is not None else ''}:{hi if hi is not None else ''}]")

    # --- tuples and shape lists -----------------------------------------------------------------
    def check_TupleExpr(self, e: A.TupleExpr, expected: Type | None) -> Val:
        wants = expected.items if isinstance(expected, TupleType) and len(expected.items) == len(e.items) else None
        items = []
        for i, item in enumerate(e.items):
            ty, _ = self.check(item, wants[i] if wants else None)
            if isinstance(self.deref(ty), ResultType):
                self.mark_handled(item)
            items.append(ty)
        return TupleType(tuple(items)), R.ANY

    def check_ListExpr(self, e: A.ListExpr, expected: Type | None) -> Val:
        dims: list[Dim] = []
        for item in e.items:
            if isinstance(item, A.Name) and self.scope.get(item.id) is None and item.id in self.rigid_dims:
                dims.append(item.id)
                continue
            ty, _ = self.value(item)
            if isinstance(ty, IntLiteral) and ty.value >= 0:
                dims.append(ty.value)
            elif isinstance(ty, ErrorType):
                return ERROR, R.ANY
            else:
                self.diags.error(TYPE_MISMATCH, item.span, expected="a dimension (a non-negative integer constant or a symbolic dim)",
                                 found=ty)
                return ERROR, R.ANY
        return ShapeValue(tuple(dims)), R.ANY

    def unwrap_help(self, node: A.Node) -> str:
        """Taking a `Result` apart, written with the user's own expression."""
        text = self.snippet(node)
        if not isinstance(node, (A.Name, A.Call, A.MethodCall)):
            text = f"({text})"
        return f"take it apart first: `match {text} {{ Ok(v) => v, Err(e) => ... }}` or `{text}.unwrap_or(...)`"

    def snippet(self, node: A.Node) -> str:
        text = self.source.snippet(node.span)
        return text if len(text) <= 60 else text[:57] + "..."
