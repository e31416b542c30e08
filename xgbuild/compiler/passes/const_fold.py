"""Constant folding: element-wise ops on scalar constants become constants; `where` on a
constant condition becomes the chosen side.

Needs: CONST nodes are scalars. Leaves: no element-wise node whose inputs are all CONST (except
ones whose value would be NaN/Inf: they stay, so check mode can name the op that made it). Values
are computed by each op's CPU semantics (its `OpDef.cpu`) in the node's own dtype, so rounding is
exactly what the engine would do; an op's `OpDef.foldable` says whether it may be folded.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..ir.graph import Node, Op, Program, attrs_of, tree_map
from ..ops import op_def


@lru_cache(maxsize=1)
def _torch():
    # Imported on first use, not with the module: `xgc --check` never folds, and torch costs ~1 s.
    import torch

    return torch, {"bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
                   "int64": torch.int64, "uint8": torch.uint8, "float16": torch.float16,
                   "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def _foldable(n: Node) -> bool:
    """An op whose definition allows folding (its CPU semantics, run on scalars), with every input
    constant and a scalar result."""
    d = op_def(n.op)
    ok = d.foldable(n) if callable(d.foldable) else d.foldable
    return ok and d.cpu is not None and bool(n.inputs) and not n.shape


def const_fold(program: Program) -> Program:
    torch, dtypes = _torch()
    g = program.main
    consts: dict[int, object] = {}
    alias: dict[int, int] = {}
    nodes: list[Node] = []
    kept: dict[int, Node] = {}      # the nodes kept so far, by id (a list scan per `where` is quadratic)
    for n in g.nodes:
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        if n.op is Op.CONST:
            consts[n.id] = torch.tensor(n.attr("value"), dtype=dtypes[n.dtype])
        elif n.op is Op.WHERE and n.inputs[0] in consts:
            pick = n.inputs[1] if bool(consts[n.inputs[0]]) else n.inputs[2]
            chosen = kept[pick]
            if tuple(chosen.shape) == tuple(n.shape) and chosen.dtype == n.dtype:
                alias[n.id] = pick
                continue
        elif _foldable(n) and all(i in consts for i in n.inputs):
            out = op_def(n.op).cpu(n, [consts[i] for i in n.inputs], dtypes[n.dtype]).to(dtypes[n.dtype])
            if out.dtype.is_floating_point and not bool(torch.isfinite(out)):
                nodes.append(n)      # keep the op: check mode must be able to name what made a NaN/Inf
                kept[n.id] = n
                continue
            value = out.item()
            folded = replace(n, op=Op.CONST, inputs=(), attrs=attrs_of(value=bool(value) if out.dtype == torch.bool
                                                                        else value))
            consts[n.id] = out
            nodes.append(folded)
            kept[n.id] = folded
            continue
        nodes.append(n)
        kept[n.id] = n
    return program.replace_main(g.with_nodes(nodes, tree_map(g.output, lambda i: alias.get(i, i))))
