"""Building a kernel spec from a scheduled kernel, shared by the element-wise, rowwise and matmul
templates (attention builds its own): the kernel's nodes renumbered locally, its memory reads named
as operands at the level each is read, its written values as outputs.

A template passes what differs by kind: the level of each node's value (`level_of`), the domain's
dim order (`perm`, rowwise: kept dims, then reduced ones) and the spec's rank.
"""

from __future__ import annotations

from typing import Callable

from ...ir.graph import Node, Op
from ...ops import BINARY, UNARY
from ..kernel import Kernel, Schedule, ScheduleError, column_iota, row_forms, row_value_through_view
from ..spec import KernelSpec, LocalNode, const

# Nodes whose input is read at the full level, whatever their own level: they reduce (or
# normalise) the kernel's columns.
REDUCTIONS = (Op.SUM, Op.MEAN, Op.MAX, Op.MIN, Op.SOFTMAX, Op.LOG_SOFTMAX)
# Ops (the arange included) a kernel computes from the index for a value of its last dim alone:
# past this, the value is read, not recomputed at every element.
COLUMN_OPS = 8


def domain_level(rank: int) -> Callable[[Node], str]:
    """The level of a value in a kernel over the whole domain: full, unless it is rank-0 in a
    kernel of rank > 0."""
    return lambda n: "full" if tuple(n.shape) or not rank else "scalar"


def build(sched: Schedule, k: Kernel, level_of: Callable[[Node], str], perm: tuple[int, ...] = (),
          row_dims: int = 0, rank: int | None = None) -> tuple[KernelSpec, list[int], tuple[int, ...]]:
    """(the spec, the graph node of each operand, the graph nodes written) of kernel `k`;
    `rank` defaults to the domain's."""
    g = sched.graph
    inside = set(k.nodes)
    outs = set(sched.outputs(k))
    domain_rank = len(k.shape)
    local: dict[int, int] = {}
    operands: list[tuple[str, str]] = []
    operand_nodes: list[int] = []
    operand_index: dict[tuple[int, str], int] = {}
    nodes: list[LocalNode] = []

    def operand(nid: int, level: str) -> tuple:
        src = g.node(nid)
        if src.op is Op.CONST:
            return const(src.attr("value"), src.dtype)
        if tuple(src.shape) == () and domain_rank:
            level = "scalar"
        elif level == "full" and forms is not None and tuple(src.shape) == forms[0]:
            level = "row"       # a [T, 1] value in a last-dim row kernel: one load a row, not a column of them
        key = (nid, level)
        if key not in operand_index:
            operand_index[key] = len(operands)
            operands.append((src.dtype, level))
            operand_nodes.append(nid)
        return ("o", operand_index[key])

    forms = row_forms(k)
    iotas: dict[str, int] = {}

    def iota(dtype: str) -> int:
        """A local IOTA along the domain's last dim (`column_iota`), added before its first reader."""
        if dtype not in iotas:
            iotas[dtype] = len(nodes)
            nodes.append(LocalNode("iota", (), dtype, "full", (("last", True),)))
        return iotas[dtype]

    columns: dict[int, int | None] = {}      # node -> the ops computing it from the index, or None

    def column_op(x: Node) -> bool:
        shape = tuple(x.shape)
        return (x.op in UNARY or x.op in BINARY) and bool(shape) and len(shape) <= domain_rank \
            and shape[-1] == k.shape[-1] and all(d == 1 for d in shape[:-1])

    def columnar(i: int) -> bool:
        """Whether `i`, made outside the kernel, is a function of the last index alone: an arange
        along the last dim (`column_iota`), or at most COLUMN_OPS element-wise ops of [.., 1, C]
        over such values and constants (pad-products' mask `arange(C) < V`), which the kernel
        computes from the index at each element instead of loading. (A walk with a stack: such a
        chain may be long; a long one is read from memory.)"""
        stack = [i]
        while stack:
            j = stack[-1]
            x = g.node(j)
            if j in columns:
                stack.pop()
            elif column_iota(g, k, j) or not column_op(x):
                columns[j] = 1 if column_iota(g, k, j) else None
                stack.pop()
            elif pending := [q for q in x.inputs if g.node(q).op is not Op.CONST and q not in columns]:
                stack.extend(pending)
            else:
                parts = [0 if g.node(q).op is Op.CONST else columns[q] for q in x.inputs]
                total = None if None in parts else 1 + sum(parts)
                columns[j] = total if total is not None and total <= COLUMN_OPS else None
                stack.pop()
        return columns[i] is not None

    made: dict[int, int] = {}

    def column(i: int) -> int:
        """The local node computing `columnar` value i, its inputs first."""
        stack = [i]
        while stack:
            j = stack[-1]
            x = g.node(j)
            if j in made:
                stack.pop()
            elif column_iota(g, k, j):
                made[j] = iota(x.dtype)
                stack.pop()
            elif pending := [q for q in x.inputs if g.node(q).op is not Op.CONST and q not in made]:
                stack.extend(pending)
            else:
                args = tuple(const(g.node(q).attr("value"), g.node(q).dtype) if g.node(q).op is Op.CONST
                             else ("n", made[q]) for q in x.inputs)
                made[j] = len(nodes)
                nodes.append(LocalNode(x.op.value, args, x.dtype, "full"))
                stack.pop()
        return made[i]

    matmul: tuple[int, ...] = ()
    for nid in k.nodes:
        n = g.node(nid)
        level = level_of(n)
        if n.op is Op.MATMUL:
            a, b = (operand(i, "full") for i in n.inputs)
            matmul = (a[1], b[1])
            args: tuple = ()
        else:
            # An input read by a reduction (or softmax) is read at the full level.
            want = "full" if n.op in REDUCTIONS else level
            if n.op is Op.UNINDEX:      # its input in its own shape; run-time indices are scalars
                args = (operand(n.inputs[0], "gather"),) + tuple(operand(i, "scalar") for i in n.inputs[1:])
            elif n.op is Op.GATHER:     # starts its kernel (schedule.GATHERS): both inputs from memory
                args = (operand(n.inputs[0], "table"), operand(n.inputs[1], "lead"))
            else:
                args = tuple(("n", local[i]) if i in inside else
                             ("n", local[v]) if (v := row_value_through_view(g, k, i, inside)) is not None
                             and level_of(g.node(v)) == "row" else
                             ("n", column(i)) if want == "full" and columnar(i) else
                             operand(i, want) for i in n.inputs)
        # Reductions reduce the kernel's columns and element-wise ops carry no attributes: only
        # FULL's value, UNINDEX's items, GATHER's count of index dims and a safe softmax matter to the code.
        attrs: tuple = (("value", const(n.attr("value"), n.dtype)[1]),) if n.op is Op.FULL else ()
        if n.op is Op.UNINDEX:
            attrs = (("items", n.attr("items")),)
        elif n.op is Op.GATHER:
            attrs = (("lead", len(g.node(n.inputs[1]).shape)),)
        elif n.op is Op.SOFTMAX and n.attr("safe", False):
            attrs = (("safe", True),)
        local[nid] = len(nodes)
        nodes.append(LocalNode(n.op.value, args, n.dtype, level, attrs))
    outputs = tuple(local[nid] for nid in k.nodes if nid in outs)
    if not outputs:
        raise ScheduleError(f"internal: kernel {k.name} writes nothing")
    strided_out = bool(perm) and perm != tuple(range(domain_rank)) and any(nodes[o].level == "full" for o in outputs)
    lane_out = strided_out and row_dims >= 1 and perm[row_dims - 1] == domain_rank - 1
    spec = KernelSpec(k.kind, domain_rank if rank is None else rank, tuple(operands), tuple(nodes), outputs,
                      row_dims, matmul, strided_out, lane_out)
    return spec, operand_nodes, tuple(nid for nid in k.nodes if nid in outs)
