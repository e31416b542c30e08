"""Kernel specs: what one scheduled kernel computes, independent of the program it came from.

A `KernelSpec` renumbers a kernel's nodes locally and names its memory reads as operands, so the
same computation in two programs (or twice in one) has one canonical JSON text, one cache key and
one tuning job. A `Binding` maps a spec back onto one graph: which node each operand and output
is, and how each operand lines up with the kernel's iteration domain. Shapes in a spec are ranks
and levels only; sizes arrive at launch time as integer arguments.

Levels of a value inside a kernel:
- `full`: one value per element of the domain (a tile of them per program);
- `row` (rowwise kernels): one value per row, a scalar in the program;
- `scalar`: one value for the whole kernel (rank-0 operands and constants);
- `gather` (element-wise kernels): the input of an `unindex`, read through its own strides at the
  positions the node's items map each domain element to;
- `table` (element-wise kernels): the table of a `gather`, read through its own strides in the row
  its index names;
- `lead` (element-wise kernels): the indices of a `gather`, one per position of the domain's
  leading dims (the indices' rank), the same along the rest.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from ..ir.graph import Node, Op
from .schedule import Kernel, Schedule, ScheduleError

FLOAT = {"float16", "bfloat16", "float32", "float64"}


@dataclass(frozen=True)
class LocalNode:
    op: str
    args: tuple             # ("o", i) operand i, ("n", j) local node j, ("c", value, dtype) a constant
    dtype: str
    level: str              # "full" | "row" | "scalar"
    attrs: tuple = ()


@dataclass(frozen=True)
class KernelSpec:
    kind: str                                   # "elementwise" | "rowwise" | "matmul" | "attention"
    rank: int                                   # domain rank (matmul, attention: batch dims + 2)
    operands: tuple[tuple[str, str], ...]       # (dtype, level) per memory read
    nodes: tuple[LocalNode, ...]
    outputs: tuple[int, ...]                    # local node index of each written value
    row_dims: int = 0                           # rowwise: leading dims of the (permuted) domain kept
    matmul: tuple[int, ...] = ()                # matmul: the operand indices of A and B; attention: q, kT, v
    strided_out: bool = False                   # rowwise over a permuted domain: full outputs via strides

    def canonical(self) -> dict:
        return {"kind": self.kind, "rank": self.rank, "row_dims": self.row_dims, "matmul": list(self.matmul),
                "strided_out": self.strided_out,
                "operands": [list(o) for o in self.operands],
                "nodes": [[n.op, [list(a) for a in n.args], n.dtype, n.level, [list(x) for x in n.attrs]]
                          for n in self.nodes],
                "outputs": list(self.outputs)}

    @classmethod
    def from_canonical(cls, d: dict) -> "KernelSpec":
        def tup(x):
            return tuple(tup(i) for i in x) if isinstance(x, list) else x
        nodes = tuple(LocalNode(op, tuple(tup(a) for a in args), dtype, level, tuple(tup(x) for x in attrs))
                      for op, args, dtype, level, attrs in d["nodes"])
        return cls(str(d["kind"]), int(d["rank"]), tuple(tuple(o) for o in d["operands"]), nodes,
                   tuple(int(i) for i in d["outputs"]), int(d["row_dims"]), tuple(int(i) for i in d["matmul"]),
                   bool(d["strided_out"]))

    def text(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), allow_nan=False,
                          default=_json_default)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()

    @property
    def name(self) -> str:
        return f"xg_{self.kind}_{self.digest[:12]}"


def _json_default(v):
    raise TypeError(f"not canonical JSON: {v!r}")


@dataclass(frozen=True)
class Binding:
    """A spec placed on one graph: node ids of its operands and outputs, and the domain."""
    operands: tuple[int, ...]       # graph node id read by each operand
    outputs: tuple[int, ...]        # graph node id written by each output
    domain: int                     # the graph node whose shape is the (unpermuted) domain
    domain_from: str                # "shape" (the node's shape) or "input0" (its first input's shape)
    perm: tuple[int, ...] = ()      # rowwise: domain dims in kernel order (kept dims, then reduced)

    def to_json(self) -> dict:
        return {"operands": list(self.operands), "outputs": list(self.outputs), "domain": self.domain,
                "domain_from": self.domain_from, "perm": list(self.perm)}

    @classmethod
    def from_json(cls, d: dict) -> "Binding":
        return cls(tuple(d["operands"]), tuple(d["outputs"]), int(d["domain"]), str(d["domain_from"]),
                   tuple(d["perm"]))


def _const(value, dtype: str) -> tuple:
    if isinstance(value, float) and not math.isfinite(value):
        value = repr(value)             # "inf", "-inf", "nan": canonical JSON has no non-finite floats
    return ("c", value, dtype)


def _attention_spec(sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
    """An attention kernel: local nodes `matmul(q, kT)`, the score chain (with the index expressions
    it reads, `iota` at level "row" or "col"), `softmax`, casts, `matmul(p, v)`. Operands read by
    the chain are at level "full" (lined up with the scores) or "scalar"."""
    from .schedule import _index_axis
    g = sched.graph
    inside = set(k.nodes)
    tree = set(k.inlined)
    out_rank = len(k.shape)
    score_rank = len(g.node(k.nodes[0]).shape)
    local: dict[int, int] = {}
    operands: list[tuple[str, str]] = []
    operand_nodes: list[int] = []
    nodes: list[LocalNode] = []

    def add(nid: int, node: LocalNode) -> tuple:
        local[nid] = len(nodes)
        nodes.append(node)
        return ("n", local[nid])

    index: dict[tuple[int, str], int] = {}

    def operand(nid: int, role: str = "") -> tuple:
        """Operand `nid`; q, kT and v (`role`) are always operands of their own, lined up with
        their own matrix dims, even when one node plays two roles."""
        src = g.node(nid)
        if src.op is Op.CONST and not role:
            return _const(src.attr("value"), src.dtype)
        level = "scalar" if tuple(src.shape) == () and not role else "full"
        key = (nid, role or level)
        if key not in index:
            index[key] = len(operands)
            operands.append((src.dtype, level))
            operand_nodes.append(nid)
        return ("o", index[key])

    def side(nid: int) -> tuple:
        if nid in local:
            return ("n", local[nid])
        n = g.node(nid)
        if nid not in tree:
            return operand(nid)
        if n.op is Op.IOTA or n.op is Op.RESHAPE:
            return add(nid, LocalNode("iota", (), n.dtype, _index_axis(n, score_rank)))
        attrs: tuple = (("value", _const(n.attr("value"), n.dtype)[1]),) if n.op is Op.FULL else ()
        return add(nid, LocalNode(n.op.value, tuple(side(i) for i in n.inputs), n.dtype, "full", attrs))

    mm: list[int] = []
    for pos, nid in enumerate(k.nodes):
        n = g.node(nid)
        if n.op is Op.MATMUL and pos == 0:
            a, b = operand(n.inputs[0], "q"), operand(n.inputs[1], "k")
            mm += [a[1], b[1]]
            add(nid, LocalNode("matmul", (), n.dtype, "full"))
        elif n.op is Op.MATMUL:
            v = operand(n.inputs[1], "v")
            mm.append(v[1])
            add(nid, LocalNode("matmul", (("n", local[n.inputs[0]]),), n.dtype, "full"))
        else:
            args = tuple(("n", local[i]) if i in inside else side(i) for i in n.inputs)
            add(nid, LocalNode(n.op.value, args, n.dtype, "full"))
    spec = KernelSpec("attention", out_rank, tuple(operands), tuple(nodes), (local[k.anchor],), 0, tuple(mm))
    return spec, Binding(tuple(operand_nodes), (k.anchor,), k.anchor, "shape")


def make_spec(sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
    """The spec of scheduled kernel `k` and its binding to `sched.graph`."""
    if k.kind == "attention":
        return _attention_spec(sched, k)
    g = sched.graph
    inside = set(k.nodes)
    outs = set(sched.outputs(k))
    domain = tuple(k.shape)
    rank = len(domain)
    fused_row = k.kind == "rowwise" and k.reduce_dims == ((rank - 1,) if rank else ())
    perm: tuple[int, ...] = ()
    row_dims = 0
    if k.kind == "rowwise":
        kept = [d for d in range(rank) if d not in k.reduce_dims]
        perm = tuple(kept + list(k.reduce_dims))
        row_dims = len(kept)

    local: dict[int, int] = {}
    operands: list[tuple[str, str]] = []
    operand_nodes: list[int] = []
    operand_index: dict[tuple[int, str], int] = {}
    nodes: list[LocalNode] = []

    def level_of(n: Node) -> str:
        shape = tuple(n.shape)
        if k.kind == "rowwise":
            if n.op in (Op.SUM, Op.MEAN, Op.MAX, Op.MIN):
                return "row"
            if n.op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
                return "full"
            return "full" if shape == domain and fused_row else "row"
        return "full" if shape or not rank else "scalar"

    def operand(nid: int, level: str) -> tuple:
        src = g.node(nid)
        if src.op is Op.CONST:
            return _const(src.attr("value"), src.dtype)
        if tuple(src.shape) == () and rank:
            level = "scalar"
        key = (nid, level)
        if key not in operand_index:
            operand_index[key] = len(operands)
            operands.append((src.dtype, level))
            operand_nodes.append(nid)
        return ("o", operand_index[key])

    matmul: tuple[int, int] = ()
    for nid in k.nodes:
        n = g.node(nid)
        level = level_of(n)
        if n.op is Op.MATMUL:
            a, b = (operand(i, "full") for i in n.inputs)
            matmul = (a[1], b[1])
            args: tuple = ()
        else:
            # An input read by a reduction (or softmax) is read at the full level.
            want = "full" if n.op in (Op.SUM, Op.MEAN, Op.MAX, Op.MIN, Op.SOFTMAX, Op.LOG_SOFTMAX) else level
            if n.op is Op.UNINDEX:      # its input in its own shape; run-time indices are scalars
                args = (operand(n.inputs[0], "gather"),) + tuple(operand(i, "scalar") for i in n.inputs[1:])
            elif n.op is Op.GATHER:     # starts its kernel (schedule.GATHERS): both inputs from memory
                args = (operand(n.inputs[0], "table"), operand(n.inputs[1], "lead"))
            else:
                args = tuple(("n", local[i]) if i in inside else operand(i, want) for i in n.inputs)
        # Reductions reduce the kernel's columns and element-wise ops carry no attributes: only
        # FULL's value, UNINDEX's items and GATHER's count of index dims matter to the code.
        attrs: tuple = (("value", _const(n.attr("value"), n.dtype)[1]),) if n.op is Op.FULL else ()
        if n.op is Op.UNINDEX:
            attrs = (("items", n.attr("items")),)
        elif n.op is Op.GATHER:
            attrs = (("lead", len(g.node(n.inputs[1]).shape)),)
        local[nid] = len(nodes)
        nodes.append(LocalNode(n.op.value, args, n.dtype, level, attrs))
    outputs = tuple(local[nid] for nid in k.nodes if nid in outs)
    if not outputs:
        raise ScheduleError(f"internal: kernel {k.name} writes nothing")
    strided_out = bool(perm) and perm != tuple(range(rank)) and any(nodes[o].level == "full" for o in outputs)
    if k.kind == "matmul":
        # The matmul template's domain is batch + (M, N): a vector operand adds its size-1 dim.
        rank += sum(len(g.node(i).shape) == 1 for i in g.node(k.anchor).inputs)
    spec = KernelSpec(k.kind, rank, tuple(operands), tuple(nodes), outputs, row_dims, matmul, strided_out)
    written = tuple(nid for nid in k.nodes if nid in outs)
    if k.kind == "rowwise":
        return spec, Binding(tuple(operand_nodes), written, k.anchor, "input0", perm)
    return spec, Binding(tuple(operand_nodes), written, k.nodes[0], "shape")


def kernel_specs(sched: Schedule) -> list[tuple[KernelSpec, Binding]]:
    return [make_spec(sched, k) for k in sched.kernels if k.kind != "extern"]
