"""Shape specialisation: symbolic dims become the sizes of the inputs of one run.

Needs: a graph whose INPUT shapes name the symbols. Leaves: every shape concrete, recomputed
from the inputs by the IR's shape rules, so a mismatch (a `K` of 64 against a `K` of 32) is an
error naming the op and its source line instead of a wrong answer. Runs at first use per input
shape; the result is cached by the engine.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import replace

from ..ir.graph import Graph, Op
from ..ir.serialize import where as src_text
from ..ir.shapes import ShapeError, infer

_SOURCES = {Op.INPUT, Op.CONST, Op.FULL, Op.RANDN, Op.RAND, Op.RESHAPE, Op.IOTA, Op.UNINDEX, Op.EXTERN}


class SpecializationError(ValueError):
    pass


def bind_symbols(graph: Graph, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Solve every symbol from the inputs' concrete shapes; inconsistent sizes are errors."""
    env: dict[str, int] = {}
    for name, nid in graph.inputs:
        declared = graph.node(nid).shape
        actual = shapes[name]
        if len(declared) != len(actual):
            raise SpecializationError(f"input `{name}` must have rank {len(declared)} "
                                      f"(shape {list(declared)}), got shape {list(actual)}")
        for axis, (d, a) in enumerate(zip(declared, actual)):
            if isinstance(d, int):
                if d != a:
                    raise SpecializationError(f"input `{name}` must have shape {list(declared)}, got {list(actual)} "
                                              f"(dimension {axis} must be {d})")
            elif d in env and env[d] != a:
                raise SpecializationError(f"input `{name}` has {d} = {a} (dimension {axis}), but an earlier "
                                          f"input fixed {d} = {env[d]}")
            else:
                env[d] = a
    return env


_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def size_of(dim: str, env: dict[str, int]) -> int | str:
    """A symbolic size under `env`: a symbol, or an integer expression of symbols such as `4*batch`
    (imported models reshape through such sizes); left as it is when something is unbound. An
    expression is computed from its symbols even when `env` names it too (a tuning environment
    gives every string dim a default size)."""
    if dim.isidentifier():
        return env.get(dim, dim)

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(dim)
    try:
        return ev(ast.parse(dim, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return env.get(dim, dim)


def specialize(graph: Graph, env: dict[str, int]) -> Graph:
    known: dict[int, tuple[str, tuple]] = {}
    nodes = []
    for n in graph.nodes:
        if n.op in _SOURCES:
            shape = tuple(size_of(d, env) if isinstance(d, str) else d for d in n.shape)
            unresolved = [d for d in shape if isinstance(d, str)]
            if unresolved:
                raise SpecializationError(f"the size {unresolved[0]} of a `{n.op.value}` is not fixed by the inputs")
            n = replace(n, shape=shape)
        try:
            dtype, shape = infer(n, [known[i] for i in n.inputs])
        except ShapeError as exc:
            where = f" ({src_text(n.src)})" if n.src else ""
            raise SpecializationError(f"`{n.op.value}`{where}: {exc}") from None
        n = replace(n, dtype=dtype, shape=tuple(shape))
        known[n.id] = (n.dtype, n.shape)
        nodes.append(n)
    return graph.with_nodes(nodes)
