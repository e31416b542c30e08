"""The IR verifier: run between passes in tests (and on every engine load).

Checks that ids are unique and defined before use (topological order), that every op has the
inputs and attributes its `OpDef` names, and that each node's dtype and shape follow from its inputs.

It also holds the limits an engine's program must keep (`MAX_NODES`, `MAX_RANK`, `MAX_DIM`,
symbolic dims as short names or sums and products of them): an engine is untrusted input, and a
forged shape must be refused here, not by an allocation failure later. The work is linear in the
size of the graph.
"""

from __future__ import annotations

import re

from ..ops import DTYPES, op_def
from .graph import Graph, Op, tree_ids
from .shapes import ShapeError, infer

MAX_NODES = 1 << 20
MAX_RANK = 32                   # torch's own limit is 64; no XG program comes near
MAX_DIM = 1 << 48               # a byte cap per tensor (the target's memory) is the engine's to check
MAX_SYMBOL_LENGTH = 128
# A symbolic dim: a name, or an integer expression of names (imported models reshape through `4*batch`).
_SYMBOLIC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[A-Za-z0-9_ +\-*/()]+")


class IRError(ValueError):
    """The graph breaks an IR invariant: a bug in lowering or in a pass, or a corrupt engine."""


def shape_problem(shape: object) -> str | None:
    """Why `shape` cannot be a node's shape, or None: the rank, and each dim an int in
    [0, MAX_DIM] or a symbolic dim of at most MAX_SYMBOL_LENGTH characters."""
    if not isinstance(shape, (tuple, list)):
        return f"a {type(shape).__name__}, not a list of dims"
    if len(shape) > MAX_RANK:
        return f"rank {len(shape)}, over the limit of {MAX_RANK}"
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, str)):
            return f"dim {str(d)[:40]!r} is not an integer or a symbol"
        if isinstance(d, int) and not 0 <= d <= MAX_DIM:
            text = str(d) if abs(d) < 10**20 else f"{str(d)[:12]}… ({len(str(d))} digits)"
            return f"dim {text} is outside [0, {MAX_DIM}]"
        if isinstance(d, str) and (len(d) > MAX_SYMBOL_LENGTH or not _SYMBOLIC.fullmatch(d)):
            return f"dim {d[:40]!r} is not a symbolic size"
    return None


def verify(graph: Graph, *, check_shapes: bool = True) -> None:
    if len(graph.nodes) > MAX_NODES:
        raise IRError(f"{graph.name}: {len(graph.nodes)} nodes, over the limit of {MAX_NODES}")
    seen: dict[int, tuple[str, tuple]] = {}
    for n in graph.nodes:
        where = f"{graph.name}: node %{n.id} ({n.op.value})"
        if n.id in seen:
            raise IRError(f"{where}: id defined twice")
        problem = shape_problem(n.shape)
        if problem:
            raise IRError(f"{where}: malformed shape ({problem})")
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
