"""Reverse-mode automatic differentiation: `grad(f, wrt=...)` calls get derivative functions.

Needs: lowering's CALL nodes with a `grad` attribute (wrt parameter positions, with_value,
tuple_wrt) naming a function that returns a floating-point scalar. Leaves: for each distinct
request, a new function `f/grad(...)` whose body is `f` inlined, followed by the adjoint
computation (a vector-Jacobian rule per op); the CALLs name it and carry no `grad` attribute.
Its outputs are f's outputs first (with value_and_grad), then one gradient per `wrt` parameter.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import COLLECTIVE, Graph, GraphBuilder, Node, Op, Program, attrs_of, tree_ids
from ..ir.shapes import broadcast
from .inline import _inline_graph

NON_DIFFERENTIABLE = {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR, Op.NOT, Op.IOTA,
                      Op.CONST, Op.FULL, Op.RANDN, Op.RAND, Op.PARAM, Op.INPUT}


class AutodiffError(ValueError):
    def __init__(self, message: str, src: tuple | None = None) -> None:
        super().__init__(message)
        self.src = src


def grad_name(func: str, wrt: tuple[int, ...], with_value: bool) -> str:
    return f"{func}/grad({','.join(map(str, wrt))}){'+value' if with_value else ''}"


def autodiff(program: Program) -> Program:
    done: dict[str, Graph] = {}          # inlined bodies, for differentiation
    out: dict[str, Graph] = {}

    def rewrite(g: Graph) -> Graph:
        nodes = []
        for n in g.nodes:
            spec = n.attr("grad")
            if n.op is Op.CALL and spec is not None:
                spec = dict(spec)
                wrt, with_value, tuple_wrt = tuple(spec["wrt"]), spec["with_value"], spec["tuple_wrt"]
                name = grad_name(n.attr("func"), wrt, with_value)
                if name not in out:
                    out[name] = differentiate(done[n.attr("func")], wrt, with_value, tuple_wrt, name)
                    done[name] = out[name]
                attrs = tuple((k, v) for k, v in n.attrs if k not in ("grad", "func")) + (("func", name),)
                n = replace(n, attrs=tuple(sorted(attrs)))
            nodes.append(n)
        return g.with_nodes(nodes)

    for name, fn in program.functions.items():
        fn = rewrite(fn)
        out[name] = fn
        done[name] = _inline_graph(fn, done)
    return replace(program, main=rewrite(program.main), functions=out)


class _Adjoints:
    def __init__(self, b: GraphBuilder) -> None:
        self.b = b
        self.adj: dict[int, int] = {}

    def node(self, nid: int) -> Node:
        return self.b.node(nid)

    def add(self, op: Op, inputs, like: Node | None = None, *, dtype: str | None = None, shape=None,
            attrs=(), src=None) -> int:
        dtype = dtype if dtype is not None else like.dtype
        shape = shape if shape is not None else like.shape
        return self.b.add(op, inputs, dtype, shape, attrs, src if src is not None else (like.src if like else None))

    def const(self, value: float, dtype: str) -> int:
        return self.b.add(Op.CONST, (), dtype, (), attrs_of(value=float(value)))

    def accumulate(self, nid: int, g: int) -> None:
        target = self.node(nid)
        g = self.sum_to(g, target.shape)
        if nid in self.adj:
            prev = self.adj[nid]
            self.adj[nid] = self.add(Op.ADD, (prev, g), target)
        else:
            self.adj[nid] = g

    def sum_to(self, g: int, shape) -> int:
        """Undo broadcasting: sum `g` down to `shape`."""
        gn = self.node(g)
        gs = tuple(gn.shape)
        shape = tuple(shape)
        while len(gs) > len(shape):
            g = self.add(Op.SUM, (g,), gn, shape=gs[1:], attrs=attrs_of(dim=0, keepdim=False))
            gs = gs[1:]
        for i, (have, want) in enumerate(zip(gs, shape)):
            if want == 1 and have != 1:
                gs = gs[:i] + (1,) + gs[i + 1:]
                g = self.add(Op.SUM, (g,), gn, shape=gs, attrs=attrs_of(dim=i, keepdim=True))
        return g

    def expand(self, g: int, like: Node) -> int:
        """Broadcast `g` up to `like`'s shape (adding zeros of that shape)."""
        if tuple(self.node(g).shape) == tuple(like.shape):
            return g
        zero = self.add(Op.FULL, (), like, attrs=attrs_of(value=0))
        return self.add(Op.ADD, (zero, g), like, shape=broadcast(like.shape, self.node(g).shape))


def differentiate(fn: Graph, wrt: tuple[int, ...], with_value: bool, tuple_wrt: bool, name: str) -> Graph:
    out_ids = tree_ids(fn.output)
    if len(out_ids) != 1 or fn.node(out_ids[0]).shape != () or not fn.node(out_ids[0]).dtype.startswith(("float", "bfloat")):
        raise AutodiffError(f"`{fn.name}` must return one floating-point scalar to be differentiated")
    _check_differentiable(fn, wrt, out_ids[0])
    b = GraphBuilder(name, start=max((n.id for n in fn.nodes), default=0) + 1)
    b.nodes = list(fn.nodes)
    b.params = list(fn.params)
    A = _Adjoints(b)
    staged = any(n.op is Op.STAGE for n in fn.nodes)
    loss = fn.node(out_ids[0])
    A.adj[loss.id] = A.add(Op.FULL, (), loss, attrs=attrs_of(value=1.0))
    for n in reversed(fn.nodes):
        g = A.adj.get(n.id)
        if g is None or n.op in NON_DIFFERENTIABLE:
            continue
        if staged:
            # Pipeline stages: a node's gradient is computed on the GPU that runs the node, so the
            # backward pass mirrors the forward one (passes/stage.py resolves the marker).
            g = b.add(Op.STAGE, (g, n.id), A.node(g).dtype, A.node(g).shape, (), n.src)
        _vjp(A, n, g)
    grads = []
    for pos in wrt:
        p = fn.node(fn.params[pos])
        grads.append(A.adj.get(p.id) if p.id in A.adj else A.add(Op.FULL, (), p, attrs=attrs_of(value=0)))
    gtree = {"tuple": [{"t": g} for g in grads]} if tuple_wrt else {"t": grads[0]}
    output = {"tuple": [fn.output, gtree]} if with_value else gtree
    return replace(b.build(output), params=fn.params)


def _check_differentiable(fn: Graph, wrt: tuple[int, ...], loss: int) -> None:
    """A wrt parameter that reaches the loss only through a comparison (a bool or integer turned
    into a float) has no gradient: say which op, and where, instead of returning zeros."""
    depends: set[int] = {fn.params[i] for i in wrt}
    for n in fn.nodes:
        if any(i in depends for i in n.inputs) and not (n.op is Op.WHERE and n.inputs[0] in depends
                                                        and not any(i in depends for i in n.inputs[1:])):
            depends.add(n.id)
    reaches: set[int] = {loss}
    for n in reversed(fn.nodes):
        if n.id in reaches:
            reaches.update(n.inputs)
    for n in fn.nodes:
        if n.op is Op.CAST and n.id in reaches and n.inputs[0] in depends:
            src = fn.node(n.inputs[0])
            if not src.dtype.startswith(("float", "bfloat")):
                where = f"line {n.src[0]}" + (f" of {n.src[2]}" if n.src and len(n.src) > 2 else "") if n.src else "?"
                raise AutodiffError(f"`{fn.name}` depends on a differentiated parameter only through `cast` of a "
                                    f"{src.dtype} value ({src.op.value}) at {where}: that path has no gradient",
                                    n.src)


def _vjp(A: _Adjoints, n: Node, g: int) -> None:
    op = n.op
    ins = [A.node(i) for i in n.inputs]
    x = ins[0] if ins else None

    def mul(a: int, c: int, like: Node = n) -> int:
        return A.add(Op.MUL, (a, c), like, shape=broadcast(A.node(a).shape, A.node(c).shape))

    def one() -> int:
        return A.const(1.0, n.dtype)

    if op in COLLECTIVE:
        A.accumulate(x.id, g)
    elif op is Op.ADD:
        A.accumulate(ins[0].id, g)
        A.accumulate(ins[1].id, g)
    elif op is Op.SUB:
        A.accumulate(ins[0].id, g)
        A.accumulate(ins[1].id, A.add(Op.NEG, (g,), A.node(g)))
    elif op is Op.MUL:
        A.accumulate(ins[0].id, mul(g, ins[1].id))
        A.accumulate(ins[1].id, mul(g, ins[0].id))
    elif op is Op.DIV:
        ga = A.add(Op.DIV, (g, ins[1].id), n, shape=broadcast(A.node(g).shape, ins[1].shape))
        A.accumulate(ins[0].id, ga)
        q = mul(ga, n.id)                           # g / b * (a / b)
        A.accumulate(ins[1].id, A.add(Op.NEG, (q,), A.node(q)))
    elif op is Op.NEG:
        A.accumulate(x.id, A.add(Op.NEG, (g,), A.node(g)))
    elif op is Op.EXP:
        A.accumulate(x.id, mul(g, n.id))
    elif op is Op.LOG:
        A.accumulate(x.id, A.add(Op.DIV, (g, x.id), n))
    elif op is Op.SQRT:
        half = A.const(0.5, n.dtype)
        A.accumulate(x.id, mul(g, A.add(Op.DIV, (half, n.id), n)))
    elif op is Op.RSQRT:                            # d/dx x^-1/2 = -1/2 * y^3
        y3 = mul(mul(n.id, n.id), n.id)
        A.accumulate(x.id, mul(g, mul(y3, A.const(-0.5, n.dtype))))
    elif op is Op.SIGMOID:
        A.accumulate(x.id, mul(g, mul(n.id, A.add(Op.SUB, (one(), n.id), n))))
    elif op is Op.TANH:
        A.accumulate(x.id, mul(g, A.add(Op.SUB, (one(), mul(n.id, n.id)), n)))
    elif op is Op.RELU:
        pos = A.add(Op.GT, (x.id, A.const(0.0, x.dtype)), n, dtype="bool")
        A.accumulate(x.id, A.add(Op.WHERE, (pos, g, A.const(0.0, n.dtype)), n))
    elif op is Op.ABS:
        zero = A.const(0.0, x.dtype)
        pos = A.add(Op.GT, (x.id, zero), n, dtype="bool")
        neg = A.add(Op.LT, (x.id, zero), n, dtype="bool")
        inner = A.add(Op.WHERE, (neg, A.add(Op.NEG, (g,), n), zero), n)
        A.accumulate(x.id, A.add(Op.WHERE, (pos, g, inner), n))
    elif op is Op.SILU:                             # s * (1 + x * (1 - s))
        s = A.add(Op.SIGMOID, (x.id,), n)
        t = A.add(Op.ADD, (one(), mul(x.id, A.add(Op.SUB, (one(), s), n))), n)
        A.accumulate(x.id, mul(g, mul(s, t)))
    elif op is Op.GELU:                             # Phi(x) + x * phi(x), exact (erf) form
        inv_sqrt2 = A.const(0.7071067811865476, n.dtype)
        cdf = mul(A.add(Op.ADD, (one(), A.add(Op.ERF, (mul(x.id, inv_sqrt2),), n)), n), A.const(0.5, n.dtype))
        x2 = mul(x.id, x.id)
        pdf = mul(A.add(Op.EXP, (mul(x2, A.const(-0.5, n.dtype)),), n), A.const(0.3989422804014327, n.dtype))
        A.accumulate(x.id, mul(g, A.add(Op.ADD, (cdf, mul(x.id, pdf)), n)))
    elif op is Op.ERF:
        x2 = mul(x.id, x.id)
        d = mul(A.add(Op.EXP, (A.add(Op.NEG, (x2,), n),), n), A.const(1.1283791670955126, n.dtype))
        A.accumulate(x.id, mul(g, d))
    elif op is Op.CAST:
        if x.dtype.startswith(("float", "bfloat")):
            A.accumulate(x.id, A.add(Op.CAST, (g,), x, shape=A.node(g).shape))
    elif op is Op.WHERE:
        zero = A.const(0.0, n.dtype)
        A.accumulate(ins[1].id, A.add(Op.WHERE, (ins[0].id, g, zero), n))
        A.accumulate(ins[2].id, A.add(Op.WHERE, (ins[0].id, zero, g), n))
    elif op in (Op.MAXIMUM, Op.MINIMUM):
        pick = A.add(Op.GE if op is Op.MAXIMUM else Op.LE, (ins[0].id, ins[1].id), n, dtype="bool")
        zero = A.const(0.0, n.dtype)
        A.accumulate(ins[0].id, A.add(Op.WHERE, (pick, g, zero), n))
        A.accumulate(ins[1].id, A.add(Op.WHERE, (pick, zero, g), n))
    elif op is Op.MATMUL:
        _vjp_matmul(A, n, g, ins[0], ins[1])
    elif op in (Op.SUM, Op.MEAN, Op.MAX, Op.MIN):
        _vjp_reduce(A, n, g, x)
    elif op is Op.SOFTMAX:                          # y * (g - sum(g * y))
        d = n.attr("dim")
        gy = mul(g, n.id)
        keep = tuple(1 if i == d else s for i, s in enumerate(n.shape))
        s = A.add(Op.SUM, (gy,), n, shape=keep, attrs=attrs_of(dim=d, keepdim=True))
        A.accumulate(x.id, mul(n.id, A.add(Op.SUB, (g, s), n)))
    elif op is Op.LOG_SOFTMAX:                      # g - exp(y) * sum(g)
        d = n.attr("dim")
        keep = tuple(1 if i == d else s for i, s in enumerate(n.shape))
        s = A.add(Op.SUM, (g,), n, shape=keep, attrs=attrs_of(dim=d, keepdim=True))
        A.accumulate(x.id, A.add(Op.SUB, (g, mul(A.add(Op.EXP, (n.id,), n), s)), n))
    elif op is Op.TRANSPOSE:
        A.accumulate(x.id, A.add(Op.TRANSPOSE, (g,), x, attrs=n.attrs))
    elif op is Op.RESHAPE:
        A.accumulate(x.id, A.add(Op.RESHAPE, (g,), x))
    elif op is Op.INDEX:
        A.accumulate(x.id, A.add(Op.UNINDEX, (g, *n.inputs[1:]), x, attrs=n.attrs))
    elif op is Op.UNINDEX:
        A.accumulate(x.id, A.add(Op.INDEX, (g, *n.inputs[1:]), x, attrs=n.attrs))
    elif op is Op.MOD:
        A.accumulate(ins[0].id, g)
    else:
        raise AutodiffError(f"`{op.value}` has no derivative rule")


def _vjp_matmul(A: _Adjoints, n: Node, g: int, a: Node, b: Node) -> None:
    def t(nid: int) -> int:
        m = A.node(nid)
        if len(m.shape) < 2:
            return nid
        shape = m.shape[:-2] + (m.shape[-1], m.shape[-2])
        r = len(m.shape)
        return A.add(Op.TRANSPOSE, (nid,), m, shape=shape, attrs=attrs_of(dim0=r - 2, dim1=r - 1))

    def mm(p: int, q: int) -> int:
        pn, qn = A.node(p), A.node(q)
        batch = broadcast(pn.shape[:-2], qn.shape[:-2]) if (len(pn.shape) > 2 or len(qn.shape) > 2) else ()
        shape = batch + (pn.shape[-2:-1] if len(pn.shape) >= 2 else ()) + (qn.shape[-1:] if len(qn.shape) >= 2 else ())
        return A.add(Op.MATMUL, (p, q), n, shape=shape)

    g_ = g
    a_id, b_id = a.id, b.id
    # Treat 1-D operands as matrices: [K] -> [1, K] (left) or [K, 1] (right).
    if len(a.shape) == 1:
        a_id = A.add(Op.RESHAPE, (a.id,), a, shape=(1, a.shape[0]))
        g_ = A.add(Op.RESHAPE, (g_,), A.node(g_), shape=A.node(g_).shape[:-1] + (1,) + A.node(g_).shape[-1:]) \
            if len(b.shape) >= 2 else A.add(Op.RESHAPE, (g_,), A.node(g_), shape=(1,))
    if len(b.shape) == 1:
        b_id = A.add(Op.RESHAPE, (b.id,), b, shape=(b.shape[0], 1))
        g_ = A.add(Op.RESHAPE, (g_,), A.node(g_), shape=A.node(g_).shape + (1,))
    if len(a.shape) == 1 and len(b.shape) == 1:
        g_ = A.add(Op.RESHAPE, (g,), A.node(g), shape=(1, 1))
    ga = mm(g_, t(b_id))
    gb = mm(t(a_id), g_)
    if len(a.shape) == 1:
        ga = A.add(Op.RESHAPE, (A.sum_to(ga, (1, a.shape[0])),), a, shape=a.shape)
    if len(b.shape) == 1:
        gb = A.add(Op.RESHAPE, (A.sum_to(gb, (b.shape[0], 1)),), b, shape=b.shape)
    A.accumulate(a.id, ga)
    A.accumulate(b.id, gb)


def _vjp_reduce(A: _Adjoints, n: Node, g: int, x: Node) -> None:
    dim, keep = n.attr("dim"), n.attr("keepdim", False)
    if dim is None:
        keep_shape = tuple(1 for _ in x.shape)
    else:
        keep_shape = tuple(1 if i == dim else s for i, s in enumerate(x.shape))
    gk = g if keep or not x.shape else A.add(Op.RESHAPE, (g,), A.node(g), shape=keep_shape)
    if n.op is Op.SUM:
        A.accumulate(x.id, A.expand(gk, x))
        return
    if n.op is Op.MEAN:
        # The count of reduced elements, as a value: sum a tensor of ones over the same dims
        # (shapes may be symbolic until the first run, so it cannot be a constant).
        ones = A.add(Op.FULL, (), x, attrs=attrs_of(value=1.0))
        count = A.add(Op.SUM, (ones,), x, shape=keep_shape,
                      attrs=attrs_of(dim=dim, keepdim=True) if dim is not None else attrs_of(dim=None, keepdim=True))
        A.accumulate(x.id, A.expand(A.add(Op.DIV, (gk, count), A.node(gk), shape=keep_shape), x))
        return
    # max / min: the gradient goes to the extreme elements, shared equally between ties.
    yk = n.id if keep or not x.shape else A.add(Op.RESHAPE, (n.id,), n, shape=keep_shape)
    hit = A.add(Op.EQ, (x.id, yk), x, dtype="bool")
    ones = A.add(Op.CAST, (hit,), x)
    ties = A.add(Op.SUM, (ones,), x, shape=keep_shape,
                 attrs=attrs_of(dim=dim, keepdim=True) if dim is not None else attrs_of(dim=None, keepdim=True))
    share = A.add(Op.DIV, (gk, ties), A.node(gk), shape=keep_shape)
    A.accumulate(x.id, A.add(Op.MUL, (ones, share), x))


__all__ = ["AutodiffError", "autodiff", "differentiate", "grad_name"]
