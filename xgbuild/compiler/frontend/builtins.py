"""Builtin functions: their argument rules, result types and sign facts.

`BUILTINS` maps each name to (parameter spec, rule). The spec lists parameters in positional
order with their defaults (`REQUIRED` when none); the rule receives the bound argument nodes.
"""

from __future__ import annotations

import difflib

from . import ast as A
from ..ops import UNARY_BUILTINS, Operands, op_def
from ..ops import sign as R
from .codes import BAD_CAST, BAD_DIM, BAD_KWARG, LITERAL_RANGE, NOT_CALLABLE, NOT_DIFFERENTIABLE, RANK, RESHAPE, RSQRT_UNSAFE, TYPE_MISMATCH, UNKNOWN_TYPE
from .types import (DTYPES, ERROR, DTypeValue, ErrorType, ExternVar, FloatLiteral, GradFn, IntLiteral,
                    ShapeValue, TensorType, TupleType, Type, float_fits, int_fits, is_float, is_int)

REQUIRED = object()
Val = tuple[Type, R.Sign]

_REDUCTIONS = ("sum", "mean", "max", "min")

SPECS: dict[str, list[tuple[str, object]]] = {
    **{n: [("x", REQUIRED)] for n in UNARY_BUILTINS},     # element-wise builtins: compiler/ops
    **{n: [("x", REQUIRED), ("dim", None), ("keepdim", False)] for n in _REDUCTIONS},
    "softmax": [("x", REQUIRED), ("dim", -1)],
    "log_softmax": [("x", REQUIRED), ("dim", -1)],
    "transpose": [("x", REQUIRED), ("dim0", -2), ("dim1", -1)],
    "reshape": [("x", REQUIRED), ("shape", REQUIRED)],
    "cast": [("x", REQUIRED), ("dtype", REQUIRED)],
    "where": [("cond", REQUIRED), ("a", REQUIRED), ("b", REQUIRED)],
    "maximum": [("a", REQUIRED), ("b", REQUIRED)],
    "minimum": [("a", REQUIRED), ("b", REQUIRED)],
    "zeros": [("shape", REQUIRED), ("dtype", "float32")],
    "ones": [("shape", REQUIRED), ("dtype", "float32")],
    "full": [("shape", REQUIRED), ("value", REQUIRED), ("dtype", "float32")],
    "randn": [("shape", REQUIRED), ("dtype", "float32"), ("seed", REQUIRED)],
    "rand": [("shape", REQUIRED), ("dtype", "float32"), ("seed", REQUIRED)],
    "arange": [("n", REQUIRED), ("dtype", "int64")],
    "grad": [("f", REQUIRED), ("wrt", REQUIRED)],
    "value_and_grad": [("f", REQUIRED), ("wrt", REQUIRED)],
    "shard": [("x", REQUIRED), ("dim", None)],
}


class BuiltinChecker:
    """Mixed into the function checker; see exprs.ExprChecker for the host's attributes."""

    def builtin_names(self):
        return SPECS.keys()

    def bind_builtin(self, name: str, e: A.Call) -> dict[str, object] | None:
        spec = SPECS[name]
        names = [p for p, _ in spec]
        bound: dict[str, object] = {}
        if len(e.args) > len(spec):
            self.arity_error(name, len(spec), len(e.args), e)
            return None
        for (pname, _), arg in zip(spec, e.args):
            bound[pname] = arg
        for kw in e.kwargs:
            if kw.name not in names:
                self.bad_kwarg(kw, f"`{name}` has no parameter `{kw.name}`", names)
                return None
            if kw.name in bound:
                self.bad_kwarg(kw, f"argument `{kw.name}` is given twice", names)
                return None
            bound[kw.name] = kw.value
        for pname, default in spec:
            if pname not in bound:
                if default is REQUIRED:
                    self.diags.error(BAD_KWARG, e.span, detail=f"`{name}` needs the argument `{pname}`",
                                     help=f"signature: `{name}({', '.join(names)})`")
                    return None
                bound[pname] = default
        return bound

    def call_builtin(self, name: str, e: A.Call) -> Val:
        bound = self.bind_builtin(name, e)
        if bound is None:
            for arg in e.args:
                self.check(arg)
            return ERROR, R.ANY
        if name in UNARY_BUILTINS:
            return self.b_unary(name, bound["x"])
        if name in _REDUCTIONS:
            return self.b_reduce(name, e, bound)
        return getattr(self, "b_" + name)(e, bound)

    # --- argument helpers -----------------------------------------------------------------------
    def tensor_arg(self, node: A.Expr, what: str = "a tensor") -> tuple[TensorType | None, R.Sign]:
        ty, sign = self.value(node)
        if isinstance(ty, ExternVar):
            ty = self.cannot_infer(ty, node.span)
        if isinstance(ty, IntLiteral):
            ty = TensorType("int64", ())
        elif isinstance(ty, FloatLiteral):
            ty = TensorType("float32", ())
        if isinstance(ty, ErrorType):
            return None, sign
        if not isinstance(ty, TensorType):
            self.diags.error(TYPE_MISMATCH, node.span, expected=what, found=ty)
            return None, sign
        return TensorType(self.subst.dtype(ty.dtype), tuple(self.subst.dim(d) for d in ty.shape)), sign

    def const_int(self, node: object, what: str) -> int | None:
        if isinstance(node, int) and not isinstance(node, bool):
            return node
        ty, _ = self.value(node)  # type: ignore[arg-type]
        if isinstance(ty, IntLiteral):
            return ty.value
        if not isinstance(ty, ErrorType):
            self.diags.error(TYPE_MISMATCH, node.span, expected=f"a constant integer ({what})", found=ty)  # type: ignore[union-attr]
        return None

    def const_bool(self, node: object, what: str) -> bool | None:
        if isinstance(node, bool):
            return node
        if isinstance(node, A.BoolLit):
            self.types[node.nid] = TensorType("bool", ())
            return node.value
        ty, _ = self.check(node)  # type: ignore[arg-type]
        if not isinstance(ty, ErrorType):
            self.diags.error(TYPE_MISMATCH, node.span, expected=f"`true` or `false` ({what})", found=ty)  # type: ignore[union-attr]
        return None

    def dim_arg(self, node: object, rank: int, call: A.Call) -> int | None:
        d = self.const_int(node, "a dimension")
        if d is None:
            return None
        if not -max(rank, 1) <= d < max(rank, 1):
            self.diags.error(BAD_DIM, node.span if isinstance(node, A.Node) else call.span, dim=d, rank=rank)
            return None
        return d % max(rank, 1)

    def dtype_arg(self, node: object) -> str | None:
        if isinstance(node, str):
            return node
        if isinstance(node, A.Name) and node.id not in DTYPES and self.scope.get(node.id) is None:
            close = difflib.get_close_matches(node.id, DTYPES, n=1)
            self.diags.error(UNKNOWN_TYPE, node.span, name=node.id,
                             help=f"did you mean `{close[0]}`?" if close else f"dtypes: {', '.join(DTYPES)}")
            return None
        ty, _ = self.check(node)  # type: ignore[arg-type]
        if isinstance(ty, DTypeValue):
            return ty.dtype
        if not isinstance(ty, ErrorType):
            self.diags.error(TYPE_MISMATCH, node.span, expected=f"a dtype ({', '.join(DTYPES)})", found=ty)  # type: ignore[union-attr]
        return None

    def shape_arg(self, node: object) -> ShapeValue | None:
        ty, _ = self.check(node)  # type: ignore[arg-type]
        if isinstance(ty, ShapeValue):
            return ty
        if isinstance(ty, TupleType) and all(isinstance(t, IntLiteral) and t.value >= 0 for t in ty.items):
            return ShapeValue(tuple(t.value for t in ty.items))  # type: ignore[union-attr]
        if not isinstance(ty, ErrorType):
            self.diags.error(TYPE_MISMATCH, node.span, expected="a shape such as `[4, M]`", found=ty)  # type: ignore[union-attr]
        return None

    # --- element-wise ---------------------------------------------------------------------------
    def b_unary(self, name: str, node: A.Expr) -> Val:
        """An element-wise builtin of one tensor: its dtype rule and sign fact are its `OpDef`'s."""
        d = op_def(UNARY_BUILTINS[name])
        ty, sign = self.tensor_arg(node)
        if ty is None:
            return ERROR, R.ANY
        if d.operands is Operands.FLOAT and not is_float(ty.dtype):
            self.diags.error(TYPE_MISMATCH, node.span, expected=f"{d.operands.value} for `{name}`", found=ty,
                             help=f"convert first: `{name}(cast({self.snippet(node)}, float32))`")
            return ERROR, R.ANY
        if d.operands is Operands.NUMERIC and ty.dtype == "bool":
            self.diags.error(TYPE_MISMATCH, node.span, expected=f"{d.operands.value} for `{name}`", found=ty)
            return ERROR, R.ANY
        if d.positive_operand and not R.positive(sign):
            self.diags.error(RSQRT_UNSAFE, node.span, arg=self.snippet(node), label="may be zero or negative",
                             help=f"add a positive epsilon: `{name}({self.snippet(node)} + 1e-6)`")
        return ty, (d.sign(sign) if d.sign else R.ANY)

    def b_maximum(self, e: A.Call, bound: dict) -> Val:
        ty, _ = self.elementwise_pair(e, bound["a"], bound["b"], "maximum")
        sa, sb = self.sign_of(bound["a"]), self.sign_of(bound["b"])
        # max(a, b) > 0 when either side is; >= 0 when either side is >= 0.
        sign = R.POS if R.POS in (sa, sb) else R.NONNEG if (sa <= R.NONNEG or sb <= R.NONNEG) else R.ANY
        return ty, sign

    def b_minimum(self, e: A.Call, bound: dict) -> Val:
        ty, _ = self.elementwise_pair(e, bound["a"], bound["b"], "minimum")
        sa, sb = self.sign_of(bound["a"]), self.sign_of(bound["b"])
        return ty, (R.POS if sa == R.POS and sb == R.POS else R.ANY)

    def elementwise_pair(self, e: A.Call, a: A.Expr, b: A.Expr, name: str) -> Val:
        fake = A.Binary(e.nid, e.span, "+", a, b, e.span)   # same typing as `a + b`
        ty, _ = self.check_Binary(fake, None)
        if isinstance(ty, (IntLiteral, FloatLiteral)):
            ty = self.default_literal(ty)
        return ty, R.ANY

    def b_where(self, e: A.Call, bound: dict) -> Val:
        cond, _ = self.tensor_arg(bound["cond"], "a `bool` tensor")
        if cond is None:
            return ERROR, R.ANY
        if cond.dtype != "bool":
            self.diags.error(TYPE_MISMATCH, bound["cond"].span, expected="a `bool` condition", found=cond)
            return ERROR, R.ANY
        ty, _ = self.elementwise_pair(e, bound["a"], bound["b"], "where")
        if not isinstance(ty, TensorType):
            return ERROR, R.ANY
        shape = self.broadcast(cond, ty, e)
        if shape is None:
            return ERROR, R.ANY
        signs = R.union(self.sign_of(bound["a"]), self.sign_of(bound["b"]))
        return TensorType(ty.dtype, shape), signs

    def sign_of(self, node: A.Expr) -> R.Sign:
        return self.signs.get(node.nid, R.ANY)

    # --- reductions and shape ops ---------------------------------------------------------------
    def b_reduce(self, name: str, e: A.Call, bound: dict) -> Val:
        ty, sign = self.tensor_arg(bound["x"])
        if ty is None:
            return ERROR, R.ANY
        if ty.dtype == "bool" or (name == "mean" and not is_float(ty.dtype)):
            self.diags.error(TYPE_MISMATCH, bound["x"].span,
                             expected=f"a {'floating-point' if name == 'mean' else 'numeric'} tensor for `{name}`", found=ty)
            return ERROR, R.ANY
        keepdim = self.const_bool(bound["keepdim"], "keepdim")
        if keepdim is None:
            return ERROR, R.ANY
        out_sign = R.reduce_sum(sign) if name in ("sum", "mean") else sign
        if bound["dim"] is None:
            shape = tuple(1 for _ in ty.shape) if keepdim else ()
            return TensorType(ty.dtype, shape), out_sign
        d = self.dim_arg(bound["dim"], ty.rank, e)
        if d is None:
            return ERROR, R.ANY
        if ty.rank == 0:
            return ty, out_sign
        shape = list(ty.shape)
        if keepdim:
            shape[d] = 1
        else:
            del shape[d]
        return TensorType(ty.dtype, tuple(shape)), out_sign

    def b_softmax(self, e: A.Call, bound: dict) -> Val:
        ty, _ = self.tensor_arg(bound["x"])
        if ty is None:
            return ERROR, R.ANY
        if not is_float(ty.dtype):
            self.diags.error(TYPE_MISMATCH, bound["x"].span, expected="a floating-point tensor for `softmax`", found=ty)
            return ERROR, R.ANY
        if self.dim_arg(bound["dim"], ty.rank, e) is None:
            return ERROR, R.ANY
        return ty, R.POS

    def b_log_softmax(self, e: A.Call, bound: dict) -> Val:
        ty, _ = self.b_softmax(e, bound)
        return ty, R.ANY

    def b_transpose(self, e: A.Call, bound: dict) -> Val:
        ty, sign = self.tensor_arg(bound["x"])
        if ty is None:
            return ERROR, R.ANY
        if ty.rank < 2:
            self.diags.error(RANK, bound["x"].span, detail=f"`transpose` needs a tensor of rank >= 2, found `{ty}`")
            return ERROR, R.ANY
        d0, d1 = self.dim_arg(bound["dim0"], ty.rank, e), self.dim_arg(bound["dim1"], ty.rank, e)
        if d0 is None or d1 is None:
            return ERROR, R.ANY
        shape = list(ty.shape)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        return TensorType(ty.dtype, tuple(shape)), sign

    def b_reshape(self, e: A.Call, bound: dict) -> Val:
        ty, sign = self.tensor_arg(bound["x"])
        shape = self.shape_arg(bound["shape"])
        if ty is None or shape is None:
            return ERROR, R.ANY
        if all(isinstance(d, int) for d in ty.shape + shape.dims):
            before, after = 1, 1
            for d in ty.shape:
                before *= d  # type: ignore[operator]
            for d in shape.dims:
                after *= d  # type: ignore[operator]
            if before != after:
                self.diags.error(RESHAPE, bound["shape"].span,
                                 detail=f"cannot reshape {before} elements into {shape} ({after} elements)")
                return ERROR, R.ANY
        return TensorType(ty.dtype, shape.dims), sign

    def b_cast(self, e: A.Call, bound: dict) -> Val:
        ty, sign = self.value(bound["x"])
        dtype = self.dtype_arg(bound["dtype"])
        if dtype is None or isinstance(ty, ErrorType):
            return ERROR, R.ANY
        if isinstance(ty, ExternVar):
            ty = self.cannot_infer(ty, bound["x"].span)
            return ERROR, R.ANY
        if isinstance(ty, (IntLiteral, FloatLiteral)):
            # A literal is converted now, not at run time: the value must exist in `dtype` (an
            # integer one after truncation toward zero; a float one finite), or the engine
            # would hold a wrapped or infinite constant nobody wrote.
            value = ty.value
            fits = (dtype == "bool" or (int_fits(int(value), dtype) if not is_float(dtype)
                                          else float_fits(float(value), dtype)))
            if not fits:
                self.diags.error(LITERAL_RANGE, bound["x"].span, literal=self.snippet(bound["x"]), dtype=dtype,
                                 help=f"`cast` of a literal is computed while compiling; `{dtype}` cannot hold it")
                return ERROR, R.ANY
            return TensorType(dtype, ()), sign
        if not isinstance(ty, TensorType):
            self.diags.error(BAD_CAST, bound["x"].span, detail=f"cannot cast {ty} to `{dtype}`",
                             help="`cast` converts the dtype of a scalar or tensor")
            return ERROR, R.ANY
        # Converting to a float keeps every sign; to an integer, 0.5 becomes 0: nothing is known.
        out = sign if is_float(dtype) else R.ANY
        return TensorType(dtype, ty.shape), out

    # --- constructors ---------------------------------------------------------------------------
    def b_zeros(self, e: A.Call, bound: dict) -> Val:
        return self.filled(bound, R.ZERO)

    def b_ones(self, e: A.Call, bound: dict) -> Val:
        return self.filled(bound, R.POS)

    def filled(self, bound: dict, sign: R.Sign) -> Val:
        shape, dtype = self.shape_arg(bound["shape"]), self.dtype_arg(bound["dtype"])
        if shape is None or dtype is None:
            return ERROR, R.ANY
        return TensorType(dtype, shape.dims), sign

    def b_full(self, e: A.Call, bound: dict) -> Val:
        shape, dtype = self.shape_arg(bound["shape"]), self.dtype_arg(bound["dtype"])
        vty, vsign = self.value(bound["value"])
        if shape is None or dtype is None or isinstance(vty, ErrorType):
            return ERROR, R.ANY
        if not self.accept(vty, TensorType(dtype, ()), bound["value"]):
            return ERROR, R.ANY
        return TensorType(dtype, shape.dims), vsign

    def b_randn(self, e: A.Call, bound: dict) -> Val:
        shape, dtype = self.shape_arg(bound["shape"]), self.dtype_arg(bound["dtype"])
        sty, _ = self.value(bound["seed"])
        if shape is None or dtype is None or isinstance(sty, ErrorType):
            return ERROR, R.ANY
        if not is_float(dtype):
            self.diags.error(TYPE_MISMATCH, e.span, expected="a floating-point dtype for `randn`", found=dtype)
            return ERROR, R.ANY
        if not (isinstance(sty, IntLiteral) or isinstance(sty, TensorType) and sty.rank == 0 and is_int(sty.dtype)):
            self.diags.error(TYPE_MISMATCH, bound["seed"].span, expected="an integer seed", found=sty)
            return ERROR, R.ANY
        return TensorType(dtype, shape.dims), R.ANY

    def b_arange(self, e: A.Call, bound: dict) -> Val:
        n, dtype = bound["n"], self.dtype_arg(bound["dtype"])
        if dtype is None or dtype == "bool":
            if dtype == "bool":
                self.diags.error(TYPE_MISMATCH, e.span, expected="a numeric dtype for `arange`", found=dtype)
            return ERROR, R.ANY
        if isinstance(n, A.Name) and self.scope.get(n.id) is None and n.id in self.rigid_dims:
            return TensorType(dtype, (n.id,)), R.NONNEG
        size = self.const_int(n, "the length of `arange`")
        if size is None:
            return ERROR, R.ANY
        if size < 0:
            self.diags.error(TYPE_MISMATCH, n.span, expected="a non-negative length", found=size)
            return ERROR, R.ANY
        return TensorType(dtype, (size,)), R.NONNEG

    def b_rand(self, e: A.Call, bound: dict) -> Val:
        ty, _ = self.b_randn(e, bound)
        return ty, R.POS        # samples lie in (0, 1)

    def b_shard(self, e: A.Call, bound: dict) -> Val:
        self.diags.error(NOT_CALLABLE, e.span, detail="`shard(...)` is only valid in a `with` clause",
                         help="write `with shard(A, dim=0) { ... }`")
        return ERROR, R.ANY

    # --- autodiff -------------------------------------------------------------------------------
    def b_grad(self, e: A.Call, bound: dict, with_value: bool = False) -> Val:
        f = bound["f"]
        if not (isinstance(f, A.Name) and f.id in self.funcs):
            self.diags.error(NOT_CALLABLE, f.span, detail="the first argument of `grad` is a function defined in this file")
            return ERROR, R.ANY
        sig = self.funcs[f.id]
        wrt = bound["wrt"]
        items = wrt.items if isinstance(wrt, A.TupleExpr) else [wrt]
        names = [p for p, _ in sig.params]
        positions = []
        for item in items:
            if not isinstance(item, A.Name) or item.id not in names:
                self.diags.error(NOT_DIFFERENTIABLE, item.span,
                                 detail=f"`wrt` names parameters of `{sig.name}`: {', '.join(names) or 'it has none'}")
                return ERROR, R.ANY
            ptype = dict(sig.params)[item.id]
            if isinstance(ptype, ErrorType):        # its type's error is reported already
                return ERROR, R.ANY
            if not (isinstance(ptype, TensorType) and is_float(ptype.dtype)):
                self.diags.error(NOT_DIFFERENTIABLE, item.span,
                                 detail=f"cannot differentiate with respect to `{item.id}` of type `{ptype}`",
                                 help="only floating-point parameters have gradients")
                return ERROR, R.ANY
            positions.append(names.index(item.id))
        ret = sig.ret
        if not (isinstance(ret, TensorType) and ret.rank == 0 and is_float(ret.dtype)):
            self.diags.error(NOT_DIFFERENTIABLE, f.span, detail=f"`{sig.name}` returns `{ret}`, not a floating-point scalar",
                             help="`grad` differentiates a scalar loss; reduce it first, e.g. with `mean(...)`")
            return ERROR, R.ANY
        self.calls.setdefault(self.current, set()).add(sig.name)
        return GradFn(sig.name, tuple(positions), isinstance(wrt, A.TupleExpr), with_value), R.ANY

    def b_value_and_grad(self, e: A.Call, bound: dict) -> Val:
        return self.b_grad(e, bound, with_value=True)

    def call_grad(self, g: GradFn, e: A.Call) -> Val:
        sig = self.funcs[g.func]
        ret, _ = self.call_user(sig, e)
        if isinstance(ret, ErrorType):
            return ERROR, R.ANY
        mapping = self.instantiations[e.nid]
        grads = [self.deref(self.subst.instantiate(sig.params[i][1], dict(mapping))) for i in g.wrt]
        out: Type = TupleType(tuple(grads)) if g.tuple_wrt else grads[0]
        if g.with_value:
            out = TupleType((ret, out))
        return out, R.ANY

