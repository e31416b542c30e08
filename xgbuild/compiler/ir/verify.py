"""The IR verifier: run between passes in tests (and on every engine load).

Checks that ids are unique and defined before use (topological order), that every op has the
inputs and attributes its `OpDef` names, and that each node's dtype and shape follow from its inputs.
"""

from __future__ import annotations

from ..ops import DTYPES, op_def
from .graph import Graph, Op, tree_ids
from .shapes import ShapeError, infer


class IRError(ValueError):
    """The graph breaks an IR invariant: a bug in lowering or in a pass, or a corrupt engine."""


def verify(graph: Graph, *, check_shapes: bool = True) -> None:
    seen: dict[int, tuple[str, tuple]] = {}
    for n in graph.nodes:
        where = f"{graph.name}: node %{n.id} ({n.op.value})"
        if n.id in seen:
            raise IRError(f"{where}: id defined twice")
        if n.dtype not in DTYPES:
            raise IRError(f"{where}: unknown dtype {n.dtype!r}")
        arity = op_def(n.op).arity
        if n.op in (Op.INDEX, Op.UNINDEX):
            dynamic = sum(1 for item in n.attr("items", ()) if item[0] == "d")
            arity = 1 + dynamic
        if n.op is Op.STAGE:
            arity = 1 if n.attr("stage") is not None else 2
        if arity is not None and n.op is not Op.CALL and len(n.inputs) != arity:
            raise IRError(f"{where}: takes {arity} inputs, has {len(n.inputs)}")
        for key in op_def(n.op).attrs:
            if n.attr(key, KeyError) is KeyError:
                raise IRError(f"{where}: missing attribute {key!r}")
        for i in n.inputs:
            if i not in seen:
                raise IRError(f"{where}: input %{i} is not defined before use")
        if check_shapes:
            try:
                dtype, shape = infer(n, [seen[i] for i in n.inputs])
            except ShapeError as exc:
                raise IRError(f"{where}: {exc}") from None
            if (dtype, tuple(shape)) != (n.dtype, tuple(n.shape)):
                raise IRError(f"{where}: recorded {n.dtype}{list(n.shape)} but inputs give {dtype}{list(shape)}")
        seen[n.id] = (n.dtype, n.shape)
    for name, nid in graph.inputs:
        if nid not in seen or graph.node(nid).op is not Op.INPUT:
            raise IRError(f"{graph.name}: input {name!r} is not an INPUT node")
    for nid in tree_ids(graph.output):
        if nid not in seen:
            raise IRError(f"{graph.name}: output %{nid} is not defined")
