"""The element-wise ops: one entry each, with everything from the language to the Triton line.

Each `OpDef` here is the whole op: its builtin name and the dtypes it accepts, its sign fact, its
VJP (built from other element-wise ops through the adjoint builder), its CPU semantics (a torch
function, which constant folding runs too, in the node's own dtype), its Triton expression and the
ATen/ONNX ops that map to it one to one. Adding an element-wise op is adding an entry here (and its
`Op` member in core.py); the checker, lowering, autodiff, const-fold, CPU executor, kernel emitter
and both importers pick it up.
"""

from __future__ import annotations

from functools import lru_cache

from . import sign as S
from .core import FLOATS, NO_GRADIENT, Kind, Op, OpDef, Operands, ShapeError, TritonCtx, broadcast


@lru_cache(maxsize=None)
def _resolve(path: str):
    # torch is imported on first use, not with the registry: `xgc --check` never computes, and
    # importing torch costs about a second.
    import torch
    fn = torch
    for part in path.split("."):
        fn = getattr(fn, part)
    return fn


def torch_fn(path: str):
    """CPU semantics that are one torch function of the inputs (`torch.<path>`)."""
    def run(node, args, dt):
        return _resolve(path)(*args)
    run.__qualname__ = f"torch.{path}"
    return run


# --- shape rules ---------------------------------------------------------------------------------
def _same(node, ins):
    return ins[0]


def _binary(node, ins):
    (da, sa), (db, sb) = ins
    if da != db:
        raise ShapeError(f"`{node.op.value}` of {da} and {db}")
    return da, broadcast(sa, sb)


def _compare(node, ins):
    return "bool", _binary(node, ins)[1]


def _cast(node, ins):
    return node.dtype, ins[0][1]


def _where(node, ins):
    (dc, sc), (da, sa), (db, sb) = ins
    if dc != "bool" or da != db:
        raise ShapeError(f"`where` needs a bool condition and equal dtypes, got {dc}, {da}, {db}")
    return da, broadcast(sc, broadcast(sa, sb))


# --- VJP helpers: A is passes/autodiff.py's adjoint builder ----------------------------------------
def _mul(A, a: int, c: int, like) -> int:
    return A.add(Op.MUL, (a, c), like, shape=broadcast(A.node(a).shape, A.node(c).shape))


def _one(A, n) -> int:
    return A.const(1.0, n.dtype)


def _neg(A, g: int) -> int:
    return A.add(Op.NEG, (g,), A.node(g))


def _vjp_exp(A, n, g, ins):
    A.accumulate(ins[0].id, _mul(A, g, n.id, n))


def _vjp_log(A, n, g, ins):
    A.accumulate(ins[0].id, A.add(Op.DIV, (g, ins[0].id), n))


def _vjp_sqrt(A, n, g, ins):
    half = A.const(0.5, n.dtype)
    A.accumulate(ins[0].id, _mul(A, g, A.add(Op.DIV, (half, n.id), n), n))


def _vjp_rsqrt(A, n, g, ins):                   # d/dx x^-1/2 = -1/2 * y^3
    y3 = _mul(A, _mul(A, n.id, n.id, n), n.id, n)
    A.accumulate(ins[0].id, _mul(A, g, _mul(A, y3, A.const(-0.5, n.dtype), n), n))


def _vjp_sigmoid(A, n, g, ins):
    A.accumulate(ins[0].id, _mul(A, g, _mul(A, n.id, A.add(Op.SUB, (_one(A, n), n.id), n), n), n))


def _vjp_tanh(A, n, g, ins):
    A.accumulate(ins[0].id, _mul(A, g, A.add(Op.SUB, (_one(A, n), _mul(A, n.id, n.id, n)), n), n))


def _vjp_relu(A, n, g, ins):
    x = ins[0]
    pos = A.add(Op.GT, (x.id, A.const(0.0, x.dtype)), n, dtype="bool")
    A.accumulate(x.id, A.add(Op.WHERE, (pos, g, A.const(0.0, n.dtype)), n))


def _vjp_abs(A, n, g, ins):
    x = ins[0]
    zero = A.const(0.0, x.dtype)
    pos = A.add(Op.GT, (x.id, zero), n, dtype="bool")
    neg = A.add(Op.LT, (x.id, zero), n, dtype="bool")
    inner = A.add(Op.WHERE, (neg, A.add(Op.NEG, (g,), n), zero), n)
    A.accumulate(x.id, A.add(Op.WHERE, (pos, g, inner), n))


def _vjp_silu(A, n, g, ins):                    # s * (1 + x * (1 - s))
    x = ins[0]
    s = A.add(Op.SIGMOID, (x.id,), n)
    t = A.add(Op.ADD, (_one(A, n), _mul(A, x.id, A.add(Op.SUB, (_one(A, n), s), n), n)), n)
    A.accumulate(x.id, _mul(A, g, _mul(A, s, t, n), n))


def _vjp_gelu(A, n, g, ins):                    # Phi(x) + x * phi(x), exact (erf) form
    x = ins[0]
    inv_sqrt2 = A.const(0.7071067811865476, n.dtype)
    cdf = _mul(A, A.add(Op.ADD, (_one(A, n), A.add(Op.ERF, (_mul(A, x.id, inv_sqrt2, n),), n)), n),
               A.const(0.5, n.dtype), n)
    x2 = _mul(A, x.id, x.id, n)
    pdf = _mul(A, A.add(Op.EXP, (_mul(A, x2, A.const(-0.5, n.dtype), n),), n), A.const(0.3989422804014327, n.dtype), n)
    A.accumulate(x.id, _mul(A, g, A.add(Op.ADD, (cdf, _mul(A, x.id, pdf, n)), n), n))


def _vjp_erf(A, n, g, ins):                     # 2 / sqrt(pi) * exp(-x^2)
    x = ins[0]
    x2 = _mul(A, x.id, x.id, n)
    d = _mul(A, A.add(Op.EXP, (A.add(Op.NEG, (x2,), n),), n), A.const(1.1283791670955126, n.dtype), n)
    A.accumulate(x.id, _mul(A, g, d, n))


def _vjp_sin(A, n, g, ins):
    A.accumulate(ins[0].id, _mul(A, g, A.add(Op.COS, (ins[0].id,), n), n))


def _vjp_cos(A, n, g, ins):
    A.accumulate(ins[0].id, _mul(A, g, A.add(Op.NEG, (A.add(Op.SIN, (ins[0].id,), n),), n), n))


def _vjp_neg(A, n, g, ins):
    A.accumulate(ins[0].id, _neg(A, g))


def _vjp_cast(A, n, g, ins):
    x = ins[0]
    if x.dtype in FLOATS:                       # no gradient into integers or bools
        A.accumulate(x.id, A.add(Op.CAST, (g,), x, shape=A.node(g).shape))


def _vjp_add(A, n, g, ins):
    A.accumulate(ins[0].id, g)
    A.accumulate(ins[1].id, g)


def _vjp_sub(A, n, g, ins):
    A.accumulate(ins[0].id, g)
    A.accumulate(ins[1].id, _neg(A, g))


def _vjp_mul(A, n, g, ins):
    A.accumulate(ins[0].id, _mul(A, g, ins[1].id, n))
    A.accumulate(ins[1].id, _mul(A, g, ins[0].id, n))


def _vjp_div(A, n, g, ins):
    ga = A.add(Op.DIV, (g, ins[1].id), n, shape=broadcast(A.node(g).shape, ins[1].shape))
    A.accumulate(ins[0].id, ga)
    q = _mul(A, ga, n.id, n)                    # g / b * (a / b)
    A.accumulate(ins[1].id, A.add(Op.NEG, (q,), A.node(q)))


def _vjp_mod(A, n, g, ins):
    A.accumulate(ins[0].id, g)


def _vjp_extreme(A, n, g, ins):                 # maximum / minimum: the gradient goes to the side picked
    pick = A.add(Op.GE if n.op is Op.MAXIMUM else Op.LE, (ins[0].id, ins[1].id), n, dtype="bool")
    zero = A.const(0.0, n.dtype)
    A.accumulate(ins[0].id, A.add(Op.WHERE, (pick, g, zero), n))
    A.accumulate(ins[1].id, A.add(Op.WHERE, (pick, zero, g), n))


def _vjp_where(A, n, g, ins):
    zero = A.const(0.0, n.dtype)
    A.accumulate(ins[1].id, A.add(Op.WHERE, (ins[0].id, g, zero), n))
    A.accumulate(ins[2].id, A.add(Op.WHERE, (ins[0].id, zero, g), n))


# --- CPU semantics that are more than one torch call ----------------------------------------------
def _cpu_identity(node, args, dt):
    return args[0]


def _cpu_cast(node, args, dt):
    return args[0].to(dt)


def _cpu_div(node, args, dt):
    import torch
    a, b = args
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    # Integer division truncates toward zero. A zero divisor only reaches here on a path the
    # program discards (the checker proved the taken one nonzero): give it 1. A divisor of -1 is
    # negation (wrapping, as two's complement does): the CPU's divide instruction traps on
    # INT64_MIN / -1 (SIGFPE, the process dies), so it never sees that divisor.
    minus_one = b == -1
    q = torch.div(a, torch.where((b == 0) | minus_one, torch.ones_like(b), b), rounding_mode="trunc")
    return torch.where(minus_one, torch.neg(a), q)


def _cpu_mod(node, args, dt):
    import torch
    a, b = args
    if a.dtype.is_floating_point:
        return torch.fmod(a, b)
    # As in _cpu_div: no zero divisor, and x % -1 is 0 without the trapping INT64_MIN % -1.
    minus_one = b == -1
    r = torch.fmod(a, torch.where((b == 0) | minus_one, torch.ones_like(b), b))
    return torch.where(minus_one, torch.zeros_like(r), r)


# --- Triton code that depends on the dtype ---------------------------------------------------------
def _tri_sqrt(c: TritonCtx) -> str:
    return f"tl.sqrt_rn({c.a})" if c.dtype == "float32" else f"tl.sqrt({c.a})"


def _tri_div(c: TritonCtx) -> str:
    if c.dtype in FLOATS:
        return f"({c.a}) / ({c.b})"
    # Truncating integer division; a zero divisor only reaches a discarded path (see _cpu_div).
    return f"({c.a}) // tl.where(({c.b}) == 0, 1, {c.b})"


def _tri_mod(c: TritonCtx) -> str:
    if c.dtype in FLOATS:
        return f"_fmod({c.a}, {c.b})"
    return f"({c.a}) % tl.where(({c.b}) == 0, 1, {c.b})"


def _tri_cast(c: TritonCtx) -> str:
    if c.out_dtype == "bool":
        return f"(({c.a}) != 0)"
    if c.out_dtype in ("bfloat16", "float16"):
        return f"({c.a}).to({c.tl(c.out_dtype)}).to(tl.float32)"
    return f"({c.a}).to({c.tl(c.out_dtype)})"


def _float_only(node) -> bool:
    return node.dtype in FLOATS


def unary(op: Op, *, triton, cpu, vjp, builtin: str | None = None, operands: Operands = Operands.FLOAT,
          sign=None, aten: tuple[str, ...] = (), onnx: tuple[str, ...] = (), **kw) -> OpDef:
    return OpDef(op, Kind.UNARY, 1, _same, builtin=builtin, operands=operands, sign=sign, vjp=vjp,
                 cpu=cpu, foldable=True, triton=triton, aten=aten, onnx=onnx, **kw)


def binary(op: Op, *, triton, cpu, vjp, infer=_binary, aten: tuple[str, ...] = (), onnx: tuple[str, ...] = (),
           foldable=True) -> OpDef:
    return OpDef(op, Kind.BINARY, 2, infer, vjp=vjp, cpu=cpu, foldable=foldable, triton=triton, aten=aten,
                 onnx=onnx)


def _compare_op(op: Op, code: str, aten: str, onnx: tuple[str, ...] = ()) -> OpDef:
    return binary(op, triton=f"({{a}}) {code} ({{b}})", cpu=torch_fn(aten.removeprefix("aten.")), vjp=NO_GRADIENT,
                  infer=_compare, aten=(aten,), onnx=onnx)


DEFS = (
    unary(Op.NEG, triton="-({a})", cpu=torch_fn("neg"), vjp=_vjp_neg, operands=Operands.NUMERIC,
          aten=("aten.neg",), onnx=("Neg",)),
    unary(Op.NOT, triton="({a} == 0)", cpu=torch_fn("logical_not"), vjp=NO_GRADIENT, operands=Operands.ANY,
          aten=("aten.logical_not", "aten.bitwise_not"), onnx=("Not",)),
    unary(Op.EXP, builtin="exp", sign=lambda a: S.POS, triton="tl.exp({a})", cpu=torch_fn("exp"), vjp=_vjp_exp,
          aten=("aten.exp",), onnx=("Exp",)),
    unary(Op.LOG, builtin="log", triton="tl.log({a})", cpu=torch_fn("log"), vjp=_vjp_log,
          aten=("aten.log",), onnx=("Log",)),
    unary(Op.SQRT, builtin="sqrt", sign=lambda a: S.POS if a == S.POS else S.NONNEG, triton=_tri_sqrt,
          cpu=torch_fn("sqrt"), vjp=_vjp_sqrt, aten=("aten.sqrt",), onnx=("Sqrt",)),
    unary(Op.RSQRT, builtin="rsqrt", sign=lambda a: S.POS, positive_operand=True, triton="tl.rsqrt({a})",
          cpu=torch_fn("rsqrt"), vjp=_vjp_rsqrt, aten=("aten.rsqrt",)),
    unary(Op.SIGMOID, builtin="sigmoid", sign=lambda a: S.POS, triton="tl.sigmoid({a})", cpu=torch_fn("sigmoid"),
          vjp=_vjp_sigmoid, aten=("aten.sigmoid",), onnx=("Sigmoid",)),
    unary(Op.TANH, builtin="tanh", sign=lambda a: a, triton="_tanh({a})", cpu=torch_fn("tanh"), vjp=_vjp_tanh,
          aten=("aten.tanh",), onnx=("Tanh",)),
    unary(Op.GELU, builtin="gelu", triton="0.5 * ({a}) * (1.0 + tl.erf(({a}) * 0.7071067811865476))",
          cpu=torch_fn("nn.functional.gelu"), vjp=_vjp_gelu),
    unary(Op.SILU, builtin="silu", triton="({a}) * tl.sigmoid({a})", cpu=torch_fn("nn.functional.silu"),
          vjp=_vjp_silu, aten=("aten.silu",)),
    unary(Op.RELU, builtin="relu", operands=Operands.NUMERIC, sign=lambda a: S.POS if a == S.POS else S.NONNEG,
          triton="tl.where(({a}) < 0, 0, {a})", cpu=torch_fn("relu"), vjp=_vjp_relu,
          aten=("aten.relu",), onnx=("Relu",)),
    unary(Op.ABS, builtin="abs", operands=Operands.NUMERIC, sign=lambda a: S.POS if S.nonzero(a) else S.NONNEG,
          triton="tl.abs({a})", cpu=torch_fn("abs"), vjp=_vjp_abs, aten=("aten.abs",), onnx=("Abs",)),
    unary(Op.ERF, builtin="erf", triton="tl.erf({a})", cpu=torch_fn("erf"), vjp=_vjp_erf,
          aten=("aten.erf",), onnx=("Erf",)),
    unary(Op.SIN, builtin="sin", triton="tl.sin({a})", cpu=torch_fn("sin"), vjp=_vjp_sin,
          aten=("aten.sin",), onnx=("Sin",)),
    unary(Op.COS, builtin="cos", triton="tl.cos({a})", cpu=torch_fn("cos"), vjp=_vjp_cos,
          aten=("aten.cos",), onnx=("Cos",)),
    # The identity to the values, a constant to autodiff (JAX's stop_gradient, torch's detach);
    # the simplify pass drops it once gradients are taken.
    unary(Op.STOP_GRADIENT, builtin="stop_gradient", sign=lambda a: a, triton="{a}", cpu=_cpu_identity,
          vjp=NO_GRADIENT),
    OpDef(Op.CAST, Kind.UNARY, 1, _cast, vjp=_vjp_cast, cpu=_cpu_cast, foldable=True, triton=_tri_cast),
    binary(Op.ADD, triton="({a}) + ({b})", cpu=torch_fn("add"), vjp=_vjp_add, aten=("aten.add",), onnx=("Add", "Sum")),
    binary(Op.SUB, triton="({a}) - ({b})", cpu=torch_fn("sub"), vjp=_vjp_sub, aten=("aten.sub",), onnx=("Sub",)),
    binary(Op.MUL, triton="({a}) * ({b})", cpu=torch_fn("mul"), vjp=_vjp_mul, aten=("aten.mul",), onnx=("Mul",)),
    # Integer division is folded by neither const-fold nor ONNX statics the torch way: floats only.
    binary(Op.DIV, triton=_tri_div, cpu=_cpu_div, vjp=_vjp_div, foldable=_float_only, aten=("aten.div",),
           onnx=("Div",)),
    binary(Op.MOD, triton=_tri_mod, cpu=_cpu_mod, vjp=_vjp_mod, foldable=False, aten=("aten.fmod",), onnx=("Mod",)),
    _compare_op(Op.EQ, "==", "aten.eq", ("Equal",)),
    _compare_op(Op.NE, "!=", "aten.ne"),
    _compare_op(Op.LT, "<", "aten.lt", ("Less",)),
    _compare_op(Op.LE, "<=", "aten.le", ("LessOrEqual",)),
    _compare_op(Op.GT, ">", "aten.gt", ("Greater",)),
    _compare_op(Op.GE, ">=", "aten.ge", ("GreaterOrEqual",)),
    binary(Op.AND, triton="({a}) & ({b})", cpu=torch_fn("logical_and"), vjp=NO_GRADIENT,
           aten=("aten.logical_and", "aten.bitwise_and"), onnx=("And",)),
    binary(Op.OR, triton="({a}) | ({b})", cpu=torch_fn("logical_or"), vjp=NO_GRADIENT,
           aten=("aten.logical_or", "aten.bitwise_or"), onnx=("Or",)),
    binary(Op.MAXIMUM, triton="tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", cpu=torch_fn("maximum"),
           vjp=_vjp_extreme, aten=("aten.maximum",), onnx=("Max",)),
    binary(Op.MINIMUM, triton="tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", cpu=torch_fn("minimum"),
           vjp=_vjp_extreme, aten=("aten.minimum",), onnx=("Min",)),
    OpDef(Op.WHERE, Kind.SELECT, 3, _where, vjp=_vjp_where, cpu=torch_fn("where"), triton="tl.where({a}, {b}, {c})"),
)
