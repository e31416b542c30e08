"""Reverse-mode automatic differentiation: `grad(f, wrt=...)` calls get derivative functions.

Needs: lowering's CALL nodes with a `grad` attribute (wrt parameter positions, with_value,
tuple_wrt) naming a function that returns a floating-point scalar. Leaves: for each distinct
request, a new function `f/grad(...)` whose body is `f` inlined, followed by the adjoint
computation (each op's vector-Jacobian rule, its `OpDef.vjp`); the CALLs name it and carry no `grad` attribute.
Its outputs are f's outputs first (with value_and_grad), then one gradient per `wrt` parameter.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, GraphBuilder, Node, Op, Program, attrs_of, tree_ids
from ..ops import NO_GRADIENT, broadcast, op_def
from .inline import _inline_graph
from .flash import attention_vjp, find_attention
from .remat import remat_backward


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


class Adjoints:
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
    A = Adjoints(b)
    staged = any(n.op is Op.STAGE for n in fn.nodes)
    loss = fn.node(out_ids[0])
    A.adj[loss.id] = A.add(Op.FULL, (), loss, attrs=attrs_of(value=1.0))
    # Attention's gradient recomputes its scores instead of keeping them (flash.py); not across
    # pipeline stages, whose backward pass mirrors the forward one op by op.
    attentions = {} if staged else find_attention(fn)
    for n in reversed(fn.nodes):
        g = A.adj.get(n.id)
        if g is None or op_def(n.op).vjp is NO_GRADIENT:
            continue
        if n.id in attentions:
            attention_vjp(A, attentions[n.id], g)
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
    if not staged:
        # Element-wise values the backward pass reads: recomputed there, not kept (remat.py).
        b.nodes = remat_backward(list(b.nodes), {n.id for n in fn.nodes}, set(tree_ids(output)), b.next_id)
        b.next_id = max((n.id for n in b.nodes), default=0) + 1
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


def _vjp(A: Adjoints, n: Node, g: int) -> None:
    rule = op_def(n.op).vjp
    if rule is None:
        raise AutodiffError(f"`{n.op.value}` has no derivative rule")
    rule(A, n, g, [A.node(i) for i in n.inputs])


__all__ = ["AutodiffError", "autodiff", "differentiate", "grad_name"]
