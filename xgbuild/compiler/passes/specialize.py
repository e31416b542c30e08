"""Shape specialisation: symbolic dims become the sizes of the inputs of one run.

Needs: a graph whose INPUT shapes name the symbols. Leaves: every shape concrete, recomputed
from the inputs by the IR's shape rules, so a mismatch (a `K` of 64 against a `K` of 32) is an
error naming the op and its source line instead of a wrong answer. Runs at first use per input
shape; the result is cached by the engine.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, Op
from ..ir.serialize import where as src_text
from ..ir.shapes import ShapeError, infer

_SOURCES = {Op.INPUT, Op.CONST, Op.FULL, Op.RANDN, Op.RAND, Op.RESHAPE, Op.IOTA, Op.UNINDEX}


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


def specialize(graph: Graph, env: dict[str, int]) -> Graph:
    known: dict[int, tuple[str, tuple]] = {}
    nodes = []
    for n in graph.nodes:
        if n.op in _SOURCES:
            shape = tuple(env.get(d, d) if isinstance(d, str) else d for d in n.shape)
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
