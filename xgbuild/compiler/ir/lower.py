"""Lowering: typed AST -> Graph IR.

Each `def` becomes a function graph (PARAM inputs), `main` becomes the entry graph (INPUT nodes,
one per external). Control flow is if-converted into `where` selects: the language is pure, so
both sides of an `if` can be computed and the condition picks. A `Result[T]` becomes a pair: an
int32 tag (0 = Ok, else the named error's code) and the value; `match` and `unwrap_or` are selects
on the tag. A `DivByZero` path is an ordinary value, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ..frontend import ast as A
from ..frontend import deep_stack
from ..frontend.checker import TypedProgram
from ..frontend.types import NAMED_ERRORS, FloatLiteral, IntLiteral, ResultType, TensorType, TupleType, Type
from ..ops import BUILTINS, REDUCE, UNARY_BUILTINS
from .graph import Graph, GraphBuilder, Node, Op, Program, attrs_of, tree_ids
from ..frontend.codes import PLAN_UNKNOWN, TOO_LARGE
from ..frontend.shard_plan import RegionPlan, ShardingPlan, plan_error
from .shapes import index_shape

TAG_DTYPE = "int32"
MAX_INLINED_NODES = 4_000_000    # nodes of one graph once every call is inlined
ERROR_CODES = {name: i + 1 for i, name in enumerate(NAMED_ERRORS)}


class LoweringError(Exception):
    """A construct the checker accepts but this compiler cannot lower yet; `src` is where, as
    `FunctionLowering.src` gives it (None: the program as a whole)."""

    def __init__(self, message: str, src: tuple | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.src = src
        self.code = code        # the diagnostic code, when not XG0901 (not supported yet)


@dataclass(frozen=True)
class Lit:
    value: Any


@dataclass(frozen=True)
class Err:
    code: int


@dataclass(frozen=True)
class Res:
    tag: "LVal"
    value: "LVal"


@dataclass(frozen=True)
class Tup:
    items: tuple


@dataclass(frozen=True)
class Meta:         # a dtype, shape or string argument
    value: Any


LVal = Union[int, Lit, Err, Res, Tup, Meta]

_BIN = {"+": Op.ADD, "-": Op.SUB, "*": Op.MUL, "/": Op.DIV, "%": Op.MOD, "==": Op.EQ, "!=": Op.NE,
        "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE, "and": Op.AND, "or": Op.OR}
_REDUCE = {name: op for name, op in BUILTINS.items() if op in REDUCE}


def lower(tp: TypedProgram, plan: ShardingPlan | None = None, entry: str = "main") -> Program:
    """`plan` (a checked `--sharding` file) adds SHARD nodes where its values and regions start;
    `entry` is the function the engine runs (`main`, or another whose parameters become inputs)."""
    functions: dict[str, Graph] = {}
    # Lowering recurses over the syntax tree, a few frames a level; the parser bounds its depth.
    with deep_stack():
        for name in _call_order(tp, entry):
            if name != "main":
                functions[name] = FunctionLowering(tp, name, functions, plan).run()
        if entry == "main":
            main = FunctionLowering(tp, "main", functions, plan).run()
        else:
            main = _entry_graph(tp, entry, functions[entry])
    _check_inlined_size(functions, main)
    return Program(main, functions, num_gpu=tp.num_gpu, target=tp.target, profile=tp.profile, compute=tp.compute)


def _entry_graph(tp: TypedProgram, entry: str, fn: Graph) -> Graph:
    """The engine's graph for an entry other than `main`: the function's parameters become the
    engine's inputs, named as the parameters are."""
    params = tp.funcs[entry].params
    bad = [f"`{name}: {ty}`" for name, ty in params if not isinstance(ty, TensorType)]
    if bad or len(params) != len(fn.params):
        raise LoweringError(f"the entry function `{entry}` takes {', '.join(bad) or 'a structured parameter'}; "
                            f"an entry's parameters are its engine's inputs and must be tensors or scalars")
    names = {nid: name for nid, (name, _ty) in zip(fn.params, params)}
    nodes = [Node(n.id, Op.INPUT, (), n.dtype, n.shape, attrs_of(name=names[n.id]), n.src) if n.id in names else n
             for n in fn.nodes]
    return Graph("main", tuple(nodes), tuple((names[nid], nid) for nid in fn.params), fn.output)


def _call_order(tp: TypedProgram, entry: str = "main") -> list[str]:
    """Callees before callers, only what the entry reaches."""
    calls: dict[str, set[str]] = {}
    for sig in tp.funcs.values():
        calls[sig.name] = set()
        stack: list[Any] = [sig.node.body]
        while stack:
            node = stack.pop()
            if isinstance(node, A.Name) and node.id in tp.funcs:     # a call, or `grad(f, ...)`
                calls[sig.name].add(node.id)
            if isinstance(node, A.Node):
                for field in node.__slots__:
                    stack.append(getattr(node, field, None))
            elif isinstance(node, list):
                stack.extend(node)
    # Depth-first, callees first, with a stack of its own: a chain of calls is as deep as the
    # program makes it (the checker bounds it, but this walk does not rely on that).
    order: list[str] = []
    seen: set[str] = {entry}
    todo = [(entry, iter(sorted(calls.get(entry, ()))))]
    while todo:
        name, callees = todo[-1]
        callee = next(callees, None)
        if callee is None:
            todo.pop()
            order.append(name)
        elif callee not in seen:
            seen.add(callee)
            todo.append((callee, iter(sorted(calls.get(callee, ())))))
    return order


def _check_inlined_size(functions: dict[str, Graph], main: Graph) -> None:
    """Refuse a program whose inlined graph would exceed MAX_INLINED_NODES, before the inliner
    builds it: a function that calls the one before it twice, forty deep, is 2**40 nodes."""
    size: dict[str, int] = {}
    for graph in [*functions.values(), main]:          # callees before callers
        total = 0
        for n in graph.nodes:
            total += size.get(n.attr("func"), 1) if n.op is Op.CALL else 1
        size[graph.name] = total
        if total > MAX_INLINED_NODES:
            raise LoweringError(f"inlining every call would make `{graph.name}` a graph of more than "
                                f"{MAX_INLINED_NODES:,} nodes", code=TOO_LARGE.code)


class FunctionLowering:
    def __init__(self, tp: TypedProgram, name: str, functions: dict[str, Graph], plan: ShardingPlan | None = None) -> None:
        self.tp = tp
        self.plan = plan
        # A pipeline plan's stages: each region's stage, and every stage's GPUs (on each STAGE node).
        self.stages = plan.stages(tp.num_gpu) if plan is not None and plan.pipeline else ((), {})
        self.sig = tp.funcs[name]
        self.functions = functions
        self.b = GraphBuilder(name)
        self.env: dict[str, tuple[LVal, Type]] = {}
        self.is_main = name == "main"

    # --- entry ----------------------------------------------------------------------------------
    def run(self) -> Graph:
        if self.is_main:
            for name, ty in self.tp.externals.items():
                nid = self.b.add(Op.INPUT, (), str(ty.dtype), ty.shape, attrs_of(name=name))
                self.b.inputs.append((name, nid))
                self.env[name] = (nid, ty)
            for name, dim in (self.plan.values if self.plan else ()):
                self.split(name, dim, None)
            gpus, _ = self.stages
            pieces = self.plan.microbatches * len(gpus[0]) if self.plan and gpus else 1
            for name, dim in (self.plan.micro_split if pieces > 1 else ()):   # one piece: nothing to split
                value, ty = self.env[name]
                if isinstance(value, int):          # ir/microbatch.py: split in time by a pipeline run
                    n = self.b.node(value)
                    self.env[name] = (self.b.add(Op.MICROBATCH, (value,), n.dtype, n.shape,
                                                 attrs_of(dim=dim, parts=self.plan.microbatches,
                                                          schedule=self.plan.schedule), None), ty)
        else:
            for pname, ptype in self.sig.params:
                self.env[pname] = (self.param(ptype), ptype)
            region = self.plan.region(self.sig.name) if self.plan else None
            if region is not None:
                self.apply_region(region, [p for p, _ in self.sig.params], None)
        ret_type = self.tp.main_ret if self.is_main else self.sig.ret
        value = self.seq(list(self.sig.node.body.stmts))
        if value is None or ret_type is None or ret_type == TupleType(()):
            return self.b.build({"tuple": []})
        return self.b.build(self.tree(self.conform(value, ret_type, self.sig.node)))

    def param(self, ty: Type) -> LVal:
        if isinstance(ty, TensorType):
            nid = self.b.add(Op.PARAM, (), str(ty.dtype), ty.shape, attrs_of(index=len(self.b.params)))
            self.b.params.append(nid)
            return nid
        if isinstance(ty, ResultType):
            return Res(self.param(TensorType(TAG_DTYPE, ())), self.param(ty.inner))
        if isinstance(ty, TupleType):
            return Tup(tuple(self.param(t) for t in ty.items))
        raise LoweringError(f"parameters of type {ty} are not supported")

    def tree(self, v: LVal) -> dict:
        if isinstance(v, int):
            return {"t": v}
        if isinstance(v, Tup):
            return {"tuple": [self.tree(i) for i in v.items]}
        if isinstance(v, Res):
            return {"result": {"tag": self.tree(v.tag)["t"], "value": self.tree(v.value)}}
        raise LoweringError(f"cannot return {v}")

    def src(self, node: A.Node) -> tuple:
        """(line, col) in the compiled file, or (line, col, module) in an imported one."""
        origin = self.sig.node.origin
        if origin is None:
            return self.tp.source.line_col(node.span.start)
        return (*origin.source.line_col(node.span.start), origin.module)

    def fail(self, node: A.Node, message: str) -> LoweringError:
        return LoweringError(message, self.src(node))

    # --- statements (if-conversion) -------------------------------------------------------------
    def seq(self, stmts: list[A.Stmt]) -> LVal | None:
        """Lower statements; returns the value returned on this path (None: falls off the end)."""
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, A.Return):
                return Tup(()) if stmt.value is None else self.expr(stmt.value)
            if isinstance(stmt, A.Assign):
                value = self.expr(stmt.value)
                if stmt.destructure:
                    items = value.items if isinstance(value, Tup) else ()
                    for target, item in zip(stmt.targets, items):
                        self.env[target.id] = (item, self.tp.types.get(target.nid))
                else:
                    self.env[stmt.targets[0].id] = (value, self.tp.types.get(stmt.targets[0].nid))
            elif isinstance(stmt, A.ExprStmt):
                self.expr(stmt.expr)
            elif isinstance(stmt, A.With):
                self.with_block(stmt)
                result = self.seq(list(stmt.body.stmts))
                if result is not None:
                    return result
            elif isinstance(stmt, A.If):
                result = self.if_stmt(stmt, stmts[i + 1:])
                if result is not _FALLTHROUGH:
                    return result
            elif isinstance(stmt, A.For):
                # Unrolled by the checker (frontend/loops.py): its copies of the block, in order;
                # the block never returns. The loop variable is a constant in each copy.
                for value, block in self.tp.unrolled.get(stmt.nid, ()):
                    self.env[stmt.var] = (Lit(value), IntLiteral(value))
                    self.seq(list(block.stmts))
                self.env.pop(stmt.var, None)
        return None

    def if_stmt(self, s: A.If, rest: list[A.Stmt]):
        cond = self.scalar_bool(s.cond)
        then_stmts = list(s.then.stmts)
        else_stmts = _else_stmts(s)
        if not (_returns(then_stmts) or _returns(else_stmts)):
            before = dict(self.env)
            self.seq(then_stmts)
            then_env = self.env
            self.env = dict(before)
            self.seq(else_stmts)
            else_env = self.env
            self.env = dict(before)
            for name in then_env.keys() & else_env.keys():
                (a, ta), (b, tb) = then_env[name], else_env[name]
                if a == b:
                    self.env[name] = (a, ta)
                else:
                    ty = ta if ta is not None else tb
                    self.env[name] = (self.select(cond, self.conform(a, ty, s), self.conform(b, ty, s), s), ty)
            return _FALLTHROUGH
        # A branch returns: the rest of the block continues the other branch (a continuation).
        ret_type = self.tp.main_ret if self.is_main else self.sig.ret
        before = dict(self.env)
        then_val = self.seq(then_stmts + ([] if _terminates(then_stmts) else rest))
        self.env = dict(before)
        else_val = self.seq(else_stmts + ([] if _terminates(else_stmts) else rest))
        self.env = before
        if then_val is None and else_val is None:
            return None
        if then_val is None or else_val is None:
            raise self.fail(s, "a path through this `if` returns no value")
        return self.select(cond, self.conform(then_val, ret_type, s), self.conform(else_val, ret_type, s), s)

    def with_block(self, s: A.With) -> None:
        for call in s.shards:
            x = call.args[0] if call.args else next(k.value for k in call.kwargs if k.name == "x")
            if isinstance(x, A.StrLit) and self.plan and self.plan.region(x.value):
                region = self.plan.region(x.value)
                reads = _reads(s.body, self.env)
                missing = [n for n in [*(n for n, _ in region.shard), *region.replicated] if n not in reads]
                if missing:
                    raise plan_error(PLAN_UNKNOWN, f"region `{region.name}` does not read `{missing[0]}`",
                                     f"{self.plan.name}: [regions.{region.name}]",
                                     "it reads: " + (", ".join(f"`{n}`" for n in reads) or "nothing from outside"))
                self.apply_region(region, reads, self.src(call))
                continue
            if not isinstance(x, A.Name) or x.id not in self.env:
                continue
            dim = next((k.value for k in call.kwargs if k.name == "dim"), call.args[1] if len(call.args) > 1 else None)
            value, ty = self.env[x.id]
            if isinstance(value, int) and isinstance(dim, A.IntLit):
                n = self.b.node(value)
                nid = self.b.add(Op.SHARD, (value,), n.dtype, n.shape, attrs_of(dim=dim.value % max(len(n.shape), 1)),
                                 self.src(call))
                self.env[x.id] = (nid, ty)

    def apply_region(self, region: RegionPlan, names: list[str], src: tuple | None) -> None:
        if region.strategy == "pipeline":
            # Every value the region reads is used on its GPU; what it computes follows
            # (passes/stage.py places the rest of the graph).
            for name in names:
                value, ty = self.env[name]
                if isinstance(value, int):
                    n = self.b.node(value)
                    gpus, stage_of = self.stages
                    self.env[name] = (self.b.add(Op.STAGE, (value,), n.dtype, n.shape,
                                                 attrs_of(stage=stage_of[region.name], gpus=gpus), src), ty)
            return
        ranks = {n: len(self.b.node(v).shape) for n in names if isinstance(v := self.env[n][0], int)}
        for name, dim in region.dims_for(names, ranks).items():
            self.split(name, dim, src)

    def split(self, name: str, dim: int | None, src: tuple | None) -> None:
        """Rebind `name` to a SHARD of it (dim None: made whole), as `with shard(name, dim=...)` does."""
        value, ty = self.env[name]
        if isinstance(value, int):
            n = self.b.node(value)
            self.env[name] = (self.b.add(Op.SHARD, (value,), n.dtype, n.shape, attrs_of(dim=dim), src), ty)

    # --- values ---------------------------------------------------------------------------------
    def const(self, value: Any, dtype: str, node: A.Node | None = None) -> int:
        if dtype == "bool":
            value = bool(value)
        elif dtype.startswith(("int", "uint")):
            value = int(value)
        else:
            value = float(value)
        return self.b.add(Op.CONST, (), dtype, (), attrs_of(value=value), self.src(node) if node else None)

    def mat(self, v: LVal, dtype: str, node: A.Node) -> int:
        """A tensor node for `v`, giving literals the dtype their context needs."""
        if isinstance(v, int):
            return v
        if isinstance(v, Lit):
            return self.const(v.value, dtype, node)
        raise self.fail(node, f"expected a tensor value, found {type(v).__name__}")

    def conform(self, v: LVal, ty: Type | None, node: A.Node) -> LVal:
        """Shape `v` as a value of type `ty` (literals typed, errors as results)."""
        if ty is None:
            return v
        if isinstance(ty, (IntLiteral, FloatLiteral)):
            ty = TensorType("int64" if isinstance(ty, IntLiteral) else "float32", ())
        if isinstance(ty, TensorType):
            return self.mat(v, str(ty.dtype), node)
        if isinstance(ty, TupleType):
            items = v.items if isinstance(v, Tup) else ()
            return Tup(tuple(self.conform(i, t, node) for i, t in zip(items, ty.items)))
        if isinstance(ty, ResultType):
            if isinstance(v, Err):
                return Res(self.const(v.code, TAG_DTYPE, node), self.zeros(ty.inner, node))
            if isinstance(v, Res):
                return Res(v.tag, self.conform(v.value, ty.inner, node))
        return v

    def zeros(self, ty: Type, node: A.Node) -> LVal:
        if isinstance(ty, TensorType):
            return self.b.add(Op.FULL, (), str(ty.dtype), ty.shape, attrs_of(value=0), self.src(node))
        if isinstance(ty, TupleType):
            return Tup(tuple(self.zeros(t, node) for t in ty.items))
        if isinstance(ty, ResultType):
            return Res(self.const(0, TAG_DTYPE, node), self.zeros(ty.inner, node))
        raise self.fail(node, f"no zero value for {ty}")

    def select(self, cond: int, a: LVal, b: LVal, node: A.Node) -> LVal:
        if a == b:
            return a
        if isinstance(a, Tup) and isinstance(b, Tup):
            return Tup(tuple(self.select(cond, x, y, node) for x, y in zip(a.items, b.items)))
        if isinstance(a, Res) and isinstance(b, Res):
            return Res(self.select(cond, a.tag, b.tag, node), self.select(cond, a.value, b.value, node))
        if isinstance(a, int) and isinstance(b, int):
            na, nb = self.b.node(a), self.b.node(b)
            from .shapes import broadcast
            shape = broadcast(na.shape, nb.shape)
            return self.b.add(Op.WHERE, (cond, a, b), na.dtype, shape, (), self.src(node))
        raise self.fail(node, "cannot select between these values")

    def scalar_bool(self, e: A.Expr) -> int:
        v = self.expr(e)
        return self.mat(v, "bool", e)

    def ty(self, e: A.Expr) -> Type:
        return self.tp.types.get(e.nid)

    def dtype(self, e: A.Expr, v: LVal) -> str | None:
        if isinstance(v, int):
            return self.b.node(v).dtype
        ty = self.ty(e)
        return str(ty.dtype) if isinstance(ty, TensorType) else None

    # --- expressions ----------------------------------------------------------------------------
    def expr(self, e: A.Expr) -> LVal:
        ty = self.ty(e)
        if isinstance(ty, (IntLiteral, FloatLiteral)):
            return Lit(ty.value)          # folded by the checker (literals and their arithmetic)
        method = getattr(self, "e_" + type(e).__name__)
        return method(e)

    def e_BoolLit(self, e: A.BoolLit) -> LVal:
        return self.const(e.value, "bool", e)

    def e_StrLit(self, e: A.StrLit) -> LVal:
        return Meta(e.value)

    def e_Name(self, e: A.Name) -> LVal:
        if e.id in self.env:
            return self.env[e.id][0]
        origin = self.sig.node.origin
        constants = self.tp.module_constants.get(origin.module if origin else None, {})
        if e.id in constants:
            value = constants[e.id]
            return self.const(value, "bool", e) if isinstance(value, bool) else Lit(value)
        if e.id in ERROR_CODES:
            return Err(ERROR_CODES[e.id])
        return Meta(e.id)                  # a dtype name

    def e_Unary(self, e: A.Unary) -> LVal:
        v = self.expr(e.operand)
        if e.op == "+":
            return v
        ty = self.ty(e)
        op = Op.NOT if e.op == "not" else Op.NEG
        n = self.b.node(self.mat(v, str(ty.dtype), e))
        return self.b.add(op, (n.id,), n.dtype, n.shape, (), self.src(e))

    def e_Binary(self, e: A.Binary) -> LVal:
        left, right = self.expr(e.left), self.expr(e.right)
        ty = self.ty(e)
        if e.op == "@":
            return self.b.add(Op.MATMUL, (left, right), str(ty.dtype), ty.shape, (), self.src(e))
        operand_dtype = self.dtype(e.left, left) or self.dtype(e.right, right) or str(ty.dtype)
        if isinstance(left, Lit) and isinstance(right, int):
            operand_dtype = self.b.node(right).dtype
        a, b = self.mat(left, operand_dtype, e.left), self.mat(right, operand_dtype, e.right)
        return self.b.add(_BIN[e.op], (a, b), str(ty.dtype), ty.shape, (), self.src(e))

    def e_TupleExpr(self, e: A.TupleExpr) -> LVal:
        return Tup(tuple(self.expr(i) for i in e.items))

    def e_ListExpr(self, e: A.ListExpr) -> LVal:
        return Meta(self.ty(e))

    def e_Index(self, e: A.Index) -> LVal:
        base = self.expr(e.base)
        ty = self.ty(e)
        items: list[tuple] = []
        inputs = [base]
        for item in e.items:
            if isinstance(item, A.Slice):
                bounds = []
                for bound in (item.lo, item.hi, item.step):
                    v = None if bound is None else self.expr(bound)
                    if v is not None and not isinstance(v, Lit):
                        raise self.fail(bound, "slice bounds must be constants")
                    bounds.append(None if v is None else int(v.value))
                items.append(("s", *bounds))
            else:
                v = self.expr(item)
                if isinstance(v, Lit):
                    items.append(("i", int(v.value)))
                else:
                    items.append(("d", len(inputs)))
                    inputs.append(v)
        # The IR's own rule gives the shape (the checker's may hold unsolved slice dims).
        shape = index_shape(self.b.node(base).shape, items)
        return self.b.add(Op.INDEX, inputs, str(ty.dtype), shape, attrs_of(items=items), self.src(e))

    def e_MethodCall(self, e: A.MethodCall) -> LVal:
        r = self.expr(e.obj)
        rty = self.ty(e.obj)
        r = self.conform(r, rty, e)
        default = self.conform(self.expr(e.args[0]), rty.inner, e.args[0])
        ok = self.b.add(Op.EQ, (r.tag, self.const(0, TAG_DTYPE, e)), "bool", (), (), self.src(e))
        return self.select(ok, r.value, default, e)

    def e_Match(self, e: A.Match) -> LVal:
        rty = self.ty(e.scrutinee)
        r = self.conform(self.expr(e.scrutinee), rty, e)
        out_ty = self.ty(e)
        result: LVal | None = None
        for arm in reversed(e.arms):
            p = arm.pattern
            saved = dict(self.env)
            if p.ctor == "Ok" and p.binding:
                self.env[p.binding] = (r.value, rty.inner)
            body = self.conform(self.expr(arm.body), out_ty, arm.body)
            self.env = saved
            if p.ctor == "Ok":
                cond = self.b.add(Op.EQ, (r.tag, self.const(0, TAG_DTYPE, arm)), "bool", (), (), self.src(arm))
            elif p.ctor in ERROR_CODES:
                cond = self.b.add(Op.EQ, (r.tag, self.const(ERROR_CODES[p.ctor], TAG_DTYPE, arm)), "bool", (), (),
                                  self.src(arm))
            else:
                result = body      # Err(e) / _: matches whatever reaches it
                continue
            result = body if result is None else self.select(cond, body, result, arm)
        return result

    def e_Call(self, e: A.Call) -> LVal:
        if isinstance(e.func, A.Call):
            return self.grad_call(e)
        name = e.func.id
        if name == "Ok":
            return Res(self.const(0, TAG_DTYPE, e), self.expr(e.args[0]))
        if name == "Err":
            return self.expr(e.args[0])
        if name in self.tp.funcs:
            return self.call(name, e)
        return self.builtin(name, e)

    def call(self, name: str, e: A.Call) -> LVal:
        callee = self.functions[name]
        flat = self.call_args(name, e)
        dims = self.tp.instantiations.get(e.nid, {})
        call = self.b.add(Op.CALL, flat, "bool", (), attrs_of(func=name, dims=dict(sorted(dims.items()))), self.src(e))
        leaves = tree_ids(callee.output)
        projs = {}
        for i, leaf in enumerate(leaves):
            n = callee.node(leaf)
            projs[leaf] = self.b.add(Op.PROJ, (call,), n.dtype, _subst_shape(n.shape, dims), attrs_of(index=i),
                                     self.src(e))
        return _from_tree(callee.output, projs)

    def call_args(self, name: str, e: A.Call) -> list[int]:
        sig = self.tp.funcs[name]
        args_by_name = {p: None for p, _ in sig.params}
        for (pname, _), arg in zip(sig.params, e.args):
            args_by_name[pname] = arg
        for kw in e.kwargs:
            args_by_name[kw.name] = kw.value
        flat: list[int] = []
        for pname, ptype in sig.params:
            flat.extend(_leaves(self.conform(self.expr(args_by_name[pname]), ptype, e)))
        return flat

    def grad_call(self, e: A.Call) -> LVal:
        """`grad(f, wrt=...)(args)`: a CALL the autodiff pass points at f's derivative."""
        g = self.ty(e.func)
        callee = self.functions[g.func]
        dims = self.tp.instantiations.get(e.nid, {})
        spec = {"wrt": list(g.wrt), "with_value": g.with_value, "tuple_wrt": g.tuple_wrt}
        call = self.b.add(Op.CALL, self.call_args(g.func, e), "bool", (),
                          attrs_of(func=g.func, dims=dict(sorted(dims.items())), grad=spec), self.src(e))
        index = 0

        def proj(node) -> int:
            nonlocal index
            nid = self.b.add(Op.PROJ, (call,), node.dtype, _subst_shape(node.shape, dims), attrs_of(index=index),
                             self.src(e))
            index += 1
            return nid

        value = None
        if g.with_value:
            value = _from_tree(callee.output, {leaf: proj(callee.node(leaf)) for leaf in tree_ids(callee.output)})
        grads = [proj(callee.node(callee.params[i])) for i in g.wrt]
        out: LVal = Tup(tuple(grads)) if g.tuple_wrt else grads[0]
        return Tup((value, out)) if g.with_value else out

    def builtin(self, name: str, e: A.Call) -> LVal:
        ty = self.ty(e)
        bound = self.bound_args(name, e)
        src = self.src(e)
        dtype, shape = (str(ty.dtype), ty.shape) if isinstance(ty, TensorType) else (None, None)
        if name in UNARY_BUILTINS:
            x = self.mat(self.expr(bound["x"]), dtype, bound["x"])
            return self.b.add(UNARY_BUILTINS[name], (x,), dtype, shape, (), src)
        if name in _REDUCE:
            x = self.mat(self.expr(bound["x"]), dtype, bound["x"])
            dim = self.int_arg(bound.get("dim"))
            keep = self.bool_arg(bound.get("keepdim"))
            rank = len(self.b.node(x).shape)
            return self.b.add(_REDUCE[name], (x,), dtype, shape,
                              attrs_of(dim=None if dim is None else dim % max(rank, 1), keepdim=keep), src)
        if name in ("softmax", "log_softmax"):
            x = self.mat(self.expr(bound["x"]), dtype, bound["x"])
            dim = self.int_arg(bound.get("dim"), -1)
            op = Op.SOFTMAX if name == "softmax" else Op.LOG_SOFTMAX
            return self.b.add(op, (x,), dtype, shape, attrs_of(dim=dim % max(len(shape), 1)), src)
        if name == "transpose":
            x = self.expr(bound["x"])
            rank = len(shape)
            d0, d1 = self.int_arg(bound.get("dim0"), -2) % rank, self.int_arg(bound.get("dim1"), -1) % rank
            return self.b.add(Op.TRANSPOSE, (x,), dtype, shape, attrs_of(dim0=d0, dim1=d1), src)
        if name == "reshape":
            return self.b.add(Op.RESHAPE, (self.expr(bound["x"]),), dtype, shape, (), src)
        if name == "cast":
            v = self.expr(bound["x"])
            if isinstance(v, Lit):
                return self.const(v.value, dtype, e)
            return self.b.add(Op.CAST, (v,), dtype, shape, (), src)
        if name in ("maximum", "minimum"):
            a, b = self.expr(bound["a"]), self.expr(bound["b"])
            op = Op.MAXIMUM if name == "maximum" else Op.MINIMUM
            return self.b.add(op, (self.mat(a, dtype, e), self.mat(b, dtype, e)), dtype, shape, (), src)
        if name == "where":
            c = self.mat(self.expr(bound["cond"]), "bool", e)
            a, b = self.expr(bound["a"]), self.expr(bound["b"])
            return self.b.add(Op.WHERE, (c, self.mat(a, dtype, e), self.mat(b, dtype, e)), dtype, shape, (), src)
        if name in ("zeros", "ones", "full"):
            value = {"zeros": 0, "ones": 1}.get(name)
            if value is None:
                v = self.expr(bound["value"])
                if not isinstance(v, Lit):
                    node = self.mat(v, dtype, e)
                    zero = self.b.add(Op.FULL, (), dtype, shape, attrs_of(value=0), src)
                    return self.b.add(Op.ADD, (zero, node), dtype, shape, (), src)
                value = v.value
            value = bool(value) if dtype == "bool" else (int(value) if not dtype.startswith(("float", "bfloat")) else float(value))
            return self.b.add(Op.FULL, (), dtype, shape, attrs_of(value=value), src)
        if name in ("randn", "rand"):
            seed = self.mat(self.expr(bound["seed"]), "int64", e)
            return self.b.add(Op.RANDN if name == "randn" else Op.RAND, (seed,), dtype, shape, (), src)
        if name == "arange":
            return self.b.add(Op.IOTA, (), dtype, shape, (), src)
        raise self.fail(e, f"builtin `{name}` cannot be lowered")

    def bound_args(self, name: str, e: A.Call) -> dict[str, A.Expr]:
        from ..frontend.builtins import SPECS
        names = [p for p, _ in SPECS[name]]
        bound = dict(zip(names, e.args))
        bound.update({k.name: k.value for k in e.kwargs})
        return bound

    def int_arg(self, node: A.Expr | None, default: int | None = None) -> int | None:
        if node is None:
            return default
        v = self.expr(node)
        return int(v.value) if isinstance(v, Lit) else default

    def bool_arg(self, node: A.Expr | None) -> bool:
        return bool(node.value) if isinstance(node, A.BoolLit) else False


_FALLTHROUGH = object()


def _else_stmts(s: A.If) -> list[A.Stmt]:
    """The `else` branch as statements: an `else if` is one If statement."""
    if isinstance(s.orelse, A.If):
        return [s.orelse]
    return list(s.orelse.stmts) if s.orelse is not None else []


def _terminates(stmts: list[A.Stmt]) -> bool:
    for s in stmts:
        if isinstance(s, A.Return):
            return True
        if isinstance(s, A.If) and s.orelse is not None:
            if _terminates(list(s.then.stmts)) and _terminates(_else_stmts(s)):
                return True
        if isinstance(s, A.With) and _terminates(list(s.body.stmts)):
            return True
    return False


def _returns(stmts: list[A.Stmt]) -> bool:
    """Does any path through `stmts` return (not necessarily every path)?"""
    for s in stmts:
        if isinstance(s, A.Return):
            return True
        if isinstance(s, A.If):
            if _returns(list(s.then.stmts)) or _returns(_else_stmts(s)):
                return True
        if isinstance(s, A.With) and _returns(list(s.body.stmts)):
            return True
    return False


def _leaves(v: LVal) -> list[int]:
    if isinstance(v, int):
        return [v]
    if isinstance(v, Tup):
        return [x for i in v.items for x in _leaves(i)]
    if isinstance(v, Res):
        return _leaves(v.tag) + _leaves(v.value)
    raise LoweringError(f"cannot pass {v} to a function")


def _from_tree(tree: dict, ids: dict[int, int]) -> LVal:
    if "t" in tree:
        return ids[tree["t"]]
    if "tuple" in tree:
        return Tup(tuple(_from_tree(t, ids) for t in tree["tuple"]))
    return Res(ids[tree["result"]["tag"]], _from_tree(tree["result"]["value"], ids))


def _subst_shape(shape, dims: dict) -> tuple:
    return tuple(dims.get(d, d) if isinstance(d, str) else d for d in shape)


def _reads(block: A.Block, env: dict) -> list[str]:
    """The names a block reads that are bound before it (its inputs), in first-use order."""
    out: list[str] = []
    stack: list[Any] = [block]
    while stack:
        node = stack.pop()
        if isinstance(node, A.Name) and node.id in env and node.id not in out:
            out.append(node.id)
        if isinstance(node, A.Node):
            for field in reversed(node.__slots__):
                stack.append(getattr(node, field, None))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return out
