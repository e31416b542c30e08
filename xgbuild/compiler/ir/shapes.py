"""Shape and dtype rules of every IR op, for symbolic and concrete dims alike.

`infer` recomputes a node's dtype and shape from its inputs by the op's own rule (its `OpDef.infer`
in compiler/ops). The verifier uses it to check that a pass left the graph consistent; shape
specialisation uses it to check concrete sizes at first run (a `K` of 64 against a `K` of 32 is
caught there, naming the op and its source line).
"""

from __future__ import annotations

from ..ops import FLOATS, INTEGERS, ShapeError, broadcast, index_shape, numel, op_def  # noqa: F401 (shape API)
from .graph import Node, Shape


def infer(node: Node, ins: list[tuple[str, Shape]]) -> tuple[str, Shape]:
    """The (dtype, shape) `node` must have given its inputs' (dtype, shape)."""
    return op_def(node.op).infer(node, ins)


def index_axis(n: Node, rank: int) -> str | None:
    """Which score dim an IOTA (or a reshape of one adding size-1 dims) runs along, right-aligned
    to a domain of `rank` dims: "row" (the query dim), "col" (the key dim), else None."""
    shape = tuple(n.shape)
    big = [d for d, size in enumerate(shape) if size != 1]
    if len(big) != 1 or len(shape) > rank:
        return None
    return {0: "col", 1: "row"}.get(len(shape) - 1 - big[0])
