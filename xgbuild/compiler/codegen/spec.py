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
    kind: str                                   # a kernel kind: a key of templates.TEMPLATES
    rank: int                                   # domain rank (matmul, attention: batch dims + 2)
    operands: tuple[tuple[str, str], ...]       # (dtype, level) per memory read
    nodes: tuple[LocalNode, ...]
    outputs: tuple[int, ...]                    # local node index of each written value
    row_dims: int = 0                           # rowwise: leading dims of the (permuted) domain kept
    matmul: tuple[int, ...] = ()                # matmul: the operand indices of A and B; attention: q, kT, v
    strided_out: bool = False                   # rowwise over a permuted domain: full outputs via strides
    # ... whose stride along the last kept dim is 1 (buffers dense in the domain's order, whose last
    # dim is kept): the column form's stores along its rows vectorise (`launch` checks it).
    lane_out: bool = False

    def canonical(self) -> dict:
        return {"kind": self.kind, "rank": self.rank, "row_dims": self.row_dims, "matmul": list(self.matmul),
                "strided_out": self.strided_out,
                "operands": [list(o) for o in self.operands],
                "nodes": [[n.op, [list(a) for a in n.args], n.dtype, n.level, [list(x) for x in n.attrs]]
                          for n in self.nodes],
                "outputs": list(self.outputs)} | ({"lane_out": True} if self.lane_out else {})

    @classmethod
    def from_canonical(cls, d: dict) -> "KernelSpec":
        def tup(x):
            return tuple(tup(i) for i in x) if isinstance(x, list) else x
        nodes = tuple(LocalNode(op, tuple(tup(a) for a in args), dtype, level, tuple(tup(x) for x in attrs))
                      for op, args, dtype, level, attrs in d["nodes"])
        return cls(str(d["kind"]), int(d["rank"]), tuple(tuple(o) for o in d["operands"]), nodes,
                   tuple(int(i) for i in d["outputs"]), int(d["row_dims"]), tuple(int(i) for i in d["matmul"]),
                   bool(d["strided_out"]), bool(d.get("lane_out", False)))

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


def const(value, dtype: str) -> tuple:
    """A constant argument of a local node, in canonical JSON form."""
    if isinstance(value, float) and not math.isfinite(value):
        value = repr(value)             # "inf", "-inf", "nan": canonical JSON has no non-finite floats
    return ("c", value, dtype)
