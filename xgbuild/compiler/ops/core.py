"""The IR's vocabulary: the `Op` enum, an op's definition (`OpDef`), and the rules every op shares.

An `OpDef` is everything the pipeline needs of one op, in one place: how many inputs and which
attributes it takes, its dtype and shape rule, its sign fact (for the checker's division proof),
its language builtin and the ATen/ONNX ops that map to it one to one, its VJP, its CPU semantics
(which constant folding uses too) and, for element-wise ops, its line of Triton code. Consumers
look an op up (`ops.op_def(op)`), so an op added here reaches every stage of the pipeline, and
`tests/unit/ops` fails when an op lacks what a consumer needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

Dim = int | str
Shape = tuple[Dim, ...]


class Op(str, Enum):
    # sources
    INPUT = "input"            # attrs: name              an engine input (external)
    PARAM = "param"            # attrs: index             a function parameter (before inlining)
    CONST = "const"            # attrs: value             a scalar
    FULL = "full"              # attrs: value             zeros / ones / full, shape from the node
    RANDN = "randn"            # inputs: seed             counter-based normal samples
    RAND = "rand"              # inputs: seed             counter-based uniform samples in (0, 1)
    IOTA = "iota"              # 0, 1, 2, … along a 1-D shape
    # element-wise, one input (ops/elementwise.py)
    NEG = "neg"; NOT = "not"; EXP = "exp"; LOG = "log"; SQRT = "sqrt"; RSQRT = "rsqrt"  # noqa: E702
    SIGMOID = "sigmoid"; TANH = "tanh"; GELU = "gelu"; SILU = "silu"; RELU = "relu"; ABS = "abs"  # noqa: E702
    ERF = "erf"; SIN = "sin"; COS = "cos"  # noqa: E702
    CAST = "cast"              # to the node's dtype
    STOP_GRADIENT = "stop_gradient"    # its input, through which no gradient flows (gone after autodiff)
    # element-wise, two inputs (broadcasting)
    ADD = "add"; SUB = "sub"; MUL = "mul"; DIV = "div"; MOD = "mod"  # noqa: E702
    EQ = "eq"; NE = "ne"; LT = "lt"; LE = "le"; GT = "gt"; GE = "ge"  # noqa: E702
    AND = "and"; OR = "or"; MAXIMUM = "maximum"; MINIMUM = "minimum"  # noqa: E702
    WHERE = "where"            # cond, a, b
    # contractions, reductions, shape ops (ops/structural.py)
    MATMUL = "matmul"
    SUM = "sum"; MEAN = "mean"; MAX = "max"; MIN = "min"  # attrs: dim (int or None), keepdim  # noqa: E702
    SOFTMAX = "softmax"; LOG_SOFTMAX = "log_softmax"       # attrs: dim  # noqa: E702
    TRANSPOSE = "transpose"    # attrs: dim0, dim1
    RESHAPE = "reshape"        # shape from the node
    INDEX = "index"            # attrs: items; extra inputs are run-time indices
    UNINDEX = "unindex"        # attrs: items: zeros of the node's shape with the input placed where INDEX read
    GATHER = "gather"          # table, idx: table rows at integer indices: [*idx.shape, *table.shape[1:]]
    SCATTER_ADD = "scatter_add"  # idx [N], src [N, D]; attrs: rows: [rows, D], row r the sum of the src
                               # rows whose index is r (GATHER's transpose: an embedding's gradient)
    EXTERN = "extern"          # attrs: call, args (JSON), output: a PyTorch operator run eagerly (fallback="eager")
    # attention's backward pass, flash-style (ops/attention.py; made by passes/flash.py, never written)
    ATTN_LSE = "attn_lse"      # q, kT, scale; attrs: causal, fill: each query row's log-sum-exp
    ATTN_GRAD = "attn_grad"    # q, kT, v, dO, lse, delta, scale; attrs: wrt, causal, fill
    # functions (before inlining)
    CALL = "call"              # attrs: func, dims (callee symbol -> caller dim); one output per PROJ
    PROJ = "proj"              # attrs: index: the index-th output of a CALL
    # many GPUs (passes/shard.py, ir/layout.py): identity within one process
    SHARD = "shard"            # attrs: dim: this value is split along dim over NUM_GPU (a local slice)
    ALL_GATHER = "all_gather"  # attrs: dim: the slices along dim, joined on every rank
    ALL_REDUCE = "all_reduce"  # attrs: reduce ("sum"): partial sums added up on every rank
    REDUCE_SCATTER = "reduce_scatter"  # attrs: dim: partial sums added up, each rank keeping its slice
    ALL_TO_ALL = "all_to_all"  # attrs: src, dim: split along dim instead of along src
    # pipeline stages (passes/stage.py, ir/stages.py): identity within one process
    STAGE = "stage"            # attrs: stage: from here on, the value is used on GPU `stage`; before
                               # passes/stage.py also (g, x) with no attr: g goes where x lives (a VJP)
    MICROBATCH = "microbatch"  # attrs: dim, parts: a pipeline splits this input into `parts` microbatches
                               # along dim (ir/microbatch.py)


class Kind(str, Enum):
    """An op's family: what the scheduler, the sharding rules and the checks treat alike."""
    SOURCE = "source"          # no tensor inputs (or only a seed): a value made from attributes
    UNARY = "unary"            # element-wise, one input, same shape
    BINARY = "binary"          # element-wise, two inputs, broadcasting
    SELECT = "select"          # `where`: element-wise, three inputs, broadcasting
    CONTRACT = "contract"      # matmul
    REDUCE = "reduce"          # over one dim or all
    NORMALIZE = "normalize"    # softmax-like: a reduction broadcast back over its row
    VIEW = "view"              # moves or picks elements, computes nothing
    GATHER = "gather"          # rows of a table at run-time indices
    SCATTER = "scatter"        # rows added into a table at run-time indices, in a fixed order
    ATTENTION = "attention"    # softmax(scores) @ v's backward pass, recomputing the scores
    HOST = "host"              # run outside XG's kernels (a PyTorch operator)
    FUNCTION = "function"      # calls, before inlining
    COLLECTIVE = "collective"  # identity in one process; communication across ranks


class Operands(str, Enum):
    """Which dtypes a builtin accepts (the checker's rule; the IR only needs equal dtypes)."""
    FLOAT = "a floating-point tensor"
    NUMERIC = "a numeric tensor"
    ANY = "a tensor"


# A VJP receives the adjoint builder (passes/autodiff.py's `Adjoints`), the node, the id of the
# gradient flowing into it and its input nodes, and accumulates into the inputs' gradients.
Vjp = Callable[[Any, Any, int, list], None]
# CPU semantics: (node, evaluated inputs as torch tensors, the dtype to compute in) -> tensor.
CpuFn = Callable[[Any, list, Any], Any]
# Shape rule: (node, inputs' (dtype, shape)) -> the node's (dtype, shape); raises ShapeError.
InferFn = Callable[[Any, list], tuple[str, Shape]]


def NO_GRADIENT(A, n, g, ins) -> None:
    """The VJP of an op no gradient flows through (sources, comparisons, logic): autodiff skips it."""


@dataclass(frozen=True)
class TritonCtx:
    """What an element-wise op's Triton code is written from: its operands' expressions, the dtype
    it computes in (16-bit floats compute in fp32), its declared dtype, attributes and, for sources,
    the linear index of the element, with codegen's dtype names (`tl`) and literal writer."""
    xs: tuple[str, ...]
    dtype: str
    out_dtype: str
    attrs: dict
    index: str | None
    tl: Callable[[str], str]
    literal: Callable[[Any, str], str]

    @property
    def a(self) -> str:
        return self.xs[0] if self.xs else ""

    @property
    def b(self) -> str:
        return self.xs[1] if len(self.xs) > 1 else ""


@dataclass(frozen=True)
class OpDef:
    op: Op
    kind: Kind
    arity: int | None                          # tensor inputs; None: depends on attributes
    infer: InferFn                             # dtype and shape rule
    attrs: tuple[str, ...] = ()                # attributes every node of this op must carry
    # the language
    builtin: str | None = None                 # its name as a language builtin
    operands: Operands = Operands.ANY          # dtypes the builtin accepts
    sign: Callable[[frozenset], frozenset] | None = None   # sign of the result from the operand's
    positive_operand: bool = False             # the checker must prove the operand positive (rsqrt)
    # autodiff: a rule, or the reason there is none
    vjp: Vjp | None = None                     # None: not differentiable yet (autodiff says so)
    # execution
    cpu: CpuFn | None = None                   # None: the CPU executor implements it (host state)
    foldable: bool = False                     # scalar constants in, a constant out (passes/const_fold.py)
    triton: str | Callable[[TritonCtx], str] | None = None   # element-wise code; "{a}", "{b}", "{c}"
    # importers: ops that map to this one one-to-one
    aten: tuple[str, ...] = ()
    onnx: tuple[str, ...] = ()

    def triton_code(self, ctx: TritonCtx) -> str:
        if self.triton is None:
            raise NotImplementedError(f"no Triton code for `{self.op.value}`")
        if callable(self.triton):
            return self.triton(ctx)
        xs = ctx.xs + ("",) * (3 - len(ctx.xs))
        return self.triton.format(a=xs[0], b=xs[1], c=xs[2])


class ShapeError(ValueError):
    pass


class BroadcastError(ShapeError):
    """Two shapes that do not broadcast, naming the first pair of dims that differ."""

    def __init__(self, a: Shape, b: Shape, x: Dim, y: Dim) -> None:
        super().__init__(f"shapes {list(a)} and {list(b)} do not broadcast ({x} vs {y})")
        self.x, self.y = x, y


def broadcast(a: Shape, b: Shape, join: Callable[[Dim, Dim], Dim | None] | None = None) -> Shape:
    """The one broadcasting rule (trailing dims; equal, or one of them 1). Dims that differ otherwise
    go to `join` (the checker unifies symbolic dims there); without one, or when it gives None,
    the shapes do not broadcast."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            joined = join(x, y) if join is not None else None
            if joined is None:
                raise BroadcastError(a, b, x, y)
            out.append(joined)
    return tuple(reversed(out))


def attrs_of(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in kw.items() if v is not None or k in ("dim",)))


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8"})
DTYPES = frozenset({"bool", *INTEGERS, *FLOATS})


def dim_expr(text: str) -> "int | str":
    """A symbolic size written from parts ("((1)+(seq))-(1)") in its one canonical form ("seq"),
    so that sizes computed two ways compare equal; an integer when the symbols cancel."""
    import re

    import sympy
    from sympy.parsing.sympy_parser import parse_expr
    names = set(re.findall(r"[A-Za-z_]\w*", text))
    try:
        expr = parse_expr(text, local_dict={n: sympy.Symbol(n, integer=True)
                                               for n in names})
    except (SyntaxError, TypeError, ValueError, sympy.SympifyError):
        return text
    if expr.is_Integer:
        return int(expr)
    out = str(expr).replace(" ", "")
    return out if re.fullmatch(r"[\w+\-*()]+", out) else text
