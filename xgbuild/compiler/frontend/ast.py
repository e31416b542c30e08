"""The syntax tree the parser builds and the checker annotates (by node id, in side tables).

Every node has a `nid` unique within one parse and a `span`. Nodes are plain dataclasses and are
not mutated after parsing; the checker's results (types, resolved calls, value facts) live in
`TypedProgram` tables keyed by `nid`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .source import Span


@dataclass(slots=True, eq=False)
class Node:
    nid: int
    span: Span


# --- type expressions -------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class TypeName(Node):          # int64, float32, bool …
    name: str


@dataclass(slots=True, eq=False)
class DimExpr(Node):           # an integer, or a symbolic name (M) or file-level constant
    value: int | str


@dataclass(slots=True, eq=False)
class TensorTypeExpr(Node):
    dtype: TypeName
    dims: list[DimExpr]


@dataclass(slots=True, eq=False)
class ResultTypeExpr(Node):
    inner: "TypeExpr"


@dataclass(slots=True, eq=False)
class TupleTypeExpr(Node):
    items: list["TypeExpr"]


TypeExpr = TypeName | TensorTypeExpr | ResultTypeExpr | TupleTypeExpr


# --- expressions ------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class IntLit(Node):
    value: int
    text: str


@dataclass(slots=True, eq=False)
class FloatLit(Node):
    value: float
    text: str


@dataclass(slots=True, eq=False)
class BoolLit(Node):
    value: bool


@dataclass(slots=True, eq=False)
class StrLit(Node):
    value: str


@dataclass(slots=True, eq=False)
class Name(Node):
    id: str


@dataclass(slots=True, eq=False)
class Unary(Node):
    op: str                    # "-", "+", "not"
    operand: "Expr"


@dataclass(slots=True, eq=False)
class Binary(Node):
    op: str                    # + - * / % @ == != < <= > >= and or
    left: "Expr"
    right: "Expr"
    op_span: Span = Span(0, 0)


@dataclass(slots=True, eq=False)
class Keyword(Node):
    name: str
    value: "Expr"


@dataclass(slots=True, eq=False)
class Call(Node):
    func: "Expr"
    args: list["Expr"]
    kwargs: list[Keyword]


@dataclass(slots=True, eq=False)
class MethodCall(Node):
    obj: "Expr"
    method: str
    args: list["Expr"]
    kwargs: list[Keyword]
    method_span: Span = Span(0, 0)


@dataclass(slots=True, eq=False)
class Slice(Node):
    lo: "Expr | None"
    hi: "Expr | None"
    step: "Expr | None"


@dataclass(slots=True, eq=False)
class Index(Node):
    base: "Expr"
    items: list["Expr | Slice"]


@dataclass(slots=True, eq=False)
class Pattern(Node):
    ctor: str                  # "Ok", "Err", a named error ("DivByZero"), or "_"
    binding: str | None        # the bound name in Ok(v) / Err(e)
    binding_span: Span | None = None


@dataclass(slots=True, eq=False)
class Arm(Node):
    pattern: Pattern
    body: "Expr"


@dataclass(slots=True, eq=False)
class Match(Node):
    scrutinee: "Expr"
    arms: list[Arm]


@dataclass(slots=True, eq=False)
class TupleExpr(Node):
    items: list["Expr"]


@dataclass(slots=True, eq=False)
class ListExpr(Node):           # shape literals: [4, M, 8]
    items: list["Expr"]


Expr = (IntLit | FloatLit | BoolLit | StrLit | Name | Unary | Binary | Call | MethodCall | Index
        | Match | TupleExpr | ListExpr)


# --- statements -------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class Block(Node):
    stmts: list["Stmt"]


@dataclass(slots=True, eq=False)
class Assign(Node):
    targets: list[Name]        # one name, or several for `(a, b) = ...`
    value: Expr
    destructure: bool = False


@dataclass(slots=True, eq=False)
class ExprStmt(Node):
    expr: Expr


@dataclass(slots=True, eq=False)
class Return(Node):
    value: Expr | None


@dataclass(slots=True, eq=False)
class If(Node):
    cond: Expr
    then: Block
    orelse: "Block | If | None"


@dataclass(slots=True, eq=False)
class With(Node):
    shards: list[Call]         # each `shard(X, dim=d)` or `shard("region")`
    body: Block


@dataclass(slots=True, eq=False)
class For(Node):               # for l in range(N) { ... }: unrolled when compiled (checker.py)
    var: str
    var_span: Span
    bounds: list[Expr]         # range's arguments: [stop] or [start, stop]
    body: Block
    range_span: Span = Span(0, 0)


Stmt = Assign | ExprStmt | Return | If | With | For


# --- file level -------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class Param(Node):
    type: TypeExpr
    name: str


@dataclass(slots=True, eq=False)
class FuncDef(Node):
    name: str
    params: list[Param]
    ret: TypeExpr | None
    body: Block
    name_span: Span = Span(0, 0)
    syntax_errors: bool = False     # the body lost statements to parse errors
    origin: object = None           # the SourceFile of an imported function (None: this file)


@dataclass(slots=True, eq=False)
class ConstDecl(Node):         # TARGET_GPU = H100, NUM_GPU = 8, D_MODEL = 64
    name: str
    value: Expr
    origin: object = None           # set for constants of an imported module


@dataclass(slots=True, eq=False)
class Extern(Node):            # extern Tensor[float32, 64, 32] P  /  extern state Tensor[...] W
    type: TypeExpr
    name: str
    # `state` (main returns its next value: state.py pairs them) or `counter` (a scalar that
    # advances by 1 a step); None for other inputs.
    role: str | None = None


@dataclass(slots=True, eq=False)
class Import(Node):            # import std.nn  /  import mylib
    path: list[str]

    @property
    def name(self) -> str:
        return ".".join(self.path)


Decl = FuncDef | ConstDecl | Extern | Import


@dataclass(slots=True, eq=False)
class Module(Node):
    decls: list[Decl] = field(default_factory=list)
