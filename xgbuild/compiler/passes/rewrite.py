"""New nodes for a pass that rebuilds a graph in program order (`lookups`, `pad_products`)."""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Node, Op, attrs_of
from ..ir.shapes import infer
from ..ops.core import INTEGERS

FULL = ("s", None, None, None)      # an INDEX/UNINDEX item taking a dim whole


class Inserter:
    """Appends nodes with fresh ids to a pass's output list `out` and records them in `by_id`,
    each node's dtype and shape inferred from its inputs (a CAST's dtype, a RESHAPE's or UNINDEX's
    shape, a CONST's both, given)."""

    def __init__(self, by_id: dict[int, Node], out: list[Node]) -> None:
        self.by_id, self.out = by_id, out
        self.next_id = max(by_id, default=-1) + 1

    def add(self, op: Op, inputs: tuple[int, ...], src, dtype: str = "", shape: tuple = (), **attrs) -> int:
        node = Node(self.next_id, op, inputs, dtype, shape, attrs_of(**attrs), src)
        if op is not Op.CONST:
            dtype, shape = infer(node, [(self.by_id[i].dtype, self.by_id[i].shape) for i in inputs])
            node = replace(node, dtype=dtype, shape=tuple(shape))
        self.next_id += 1
        self.by_id[node.id] = node
        self.out.append(node)
        return node.id

    def const(self, value, dtype: str, src) -> int:
        """A scalar of `dtype` (the value converted to the dtype's Python kind)."""
        value = int(value) if dtype in INTEGERS else (bool(value) if dtype == "bool" else float(value))
        return self.add(Op.CONST, (), src, dtype, value=value)
