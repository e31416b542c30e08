"""The IR verifier: run between passes in tests (and on every engine load).

Checks that ids are unique and defined before use (topological order), that every op has the
inputs and attributes it needs, and that each node's dtype and shape follow from its inputs.
"""

from __future__ import annotations

from .graph import BINARY, UNARY, Graph, Op, tree_ids
from .shapes import ShapeError, infer

_ARITY = {**{op: 1 for op in UNARY}, **{op: 2 for op in BINARY}, Op.WHERE: 3, Op.MATMUL: 2, Op.GATHER: 2,
          Op.INPUT: 0, Op.PARAM: 0, Op.CONST: 0, Op.FULL: 0, Op.RANDN: 1, Op.RAND: 1, Op.IOTA: 0, Op.TRANSPOSE: 1,
          Op.RESHAPE: 1, Op.SOFTMAX: 1, Op.LOG_SOFTMAX: 1, Op.PROJ: 1, Op.SHARD: 1,
          Op.ALL_GATHER: 1, Op.ALL_REDUCE: 1, Op.REDUCE_SCATTER: 1, Op.ALL_TO_ALL: 1, Op.MICROBATCH: 1, Op.SUM: 1, Op.MEAN: 1, Op.MAX: 1, Op.MIN: 1}
_ATTRS = {Op.INPUT: ("name",), Op.PARAM: ("index",), Op.CONST: ("value",), Op.FULL: ("value",),
          Op.TRANSPOSE: ("dim0", "dim1"), Op.INDEX: ("items",), Op.UNINDEX: ("items",), Op.CALL: ("func",), Op.PROJ: ("index",),
          Op.EXTERN: ("call", "args"),
          Op.SOFTMAX: ("dim",), Op.LOG_SOFTMAX: ("dim",), Op.SHARD: ("dim",),
          Op.ALL_GATHER: ("dim",), Op.REDUCE_SCATTER: ("dim",), Op.ALL_TO_ALL: ("src", "dim"), Op.MICROBATCH: ("dim", "parts")}
DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16", "float32", "float64"}


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
        arity = _ARITY.get(n.op)
        if n.op in (Op.INDEX, Op.UNINDEX):
            dynamic = sum(1 for item in n.attr("items", ()) if item[0] == "d")
            arity = 1 + dynamic
        if n.op is Op.STAGE:
            arity = 1 if n.attr("stage") is not None else 2
        if arity is not None and n.op is not Op.CALL and len(n.inputs) != arity:
            raise IRError(f"{where}: takes {arity} inputs, has {len(n.inputs)}")
        for key in _ATTRS.get(n.op, ()):
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
