"""The Graph IR: one `Node` type with an `Op` enum, in topological order.

A node is an SSA value: op, input node ids, dtype, shape (ints, or symbol names for dims known
only at run time), attributes, and the source position it came from (for NaN reports). A `Graph`
has named inputs and an output tree (tensors, tuples and results built from node ids). A
`Program` holds `main` and, before inlining, the functions it calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Iterable

Dim = int | str
Shape = tuple[Dim, ...]


class Op(str, Enum):
    # sources
    INPUT = "input"            # attrs: name              an engine input (external)
    PARAM = "param"            # attrs: index             a function parameter (before inlining)
    CONST = "const"            # attrs: value             a scalar
    FULL = "full"              # attrs: value             zeros / ones / full, shape from the node
    RANDN = "randn"            # inputs: seed             counter-based normal samples
    RAND = "rand"              # inputs: seed             counter-based uniform samples in (0, 1)
    IOTA = "iota"              # 0, 1, 2, … along a 1-D shape
    # element-wise, one input
    NEG = "neg"; NOT = "not"; EXP = "exp"; LOG = "log"; SQRT = "sqrt"; RSQRT = "rsqrt"  # noqa: E702
    SIGMOID = "sigmoid"; TANH = "tanh"; GELU = "gelu"; SILU = "silu"; RELU = "relu"; ABS = "abs"  # noqa: E702
    ERF = "erf"
    CAST = "cast"              # to the node's dtype
    # element-wise, two inputs (broadcasting)
    ADD = "add"; SUB = "sub"; MUL = "mul"; DIV = "div"; MOD = "mod"  # noqa: E702
    EQ = "eq"; NE = "ne"; LT = "lt"; LE = "le"; GT = "gt"; GE = "ge"  # noqa: E702
    AND = "and"; OR = "or"; MAXIMUM = "maximum"; MINIMUM = "minimum"  # noqa: E702
    WHERE = "where"            # cond, a, b
    # contractions, reductions, shape ops
    MATMUL = "matmul"
    SUM = "sum"; MEAN = "mean"; MAX = "max"; MIN = "min"  # attrs: dim (int or None), keepdim  # noqa: E702
    SOFTMAX = "softmax"; LOG_SOFTMAX = "log_softmax"       # attrs: dim  # noqa: E702
    TRANSPOSE = "transpose"    # attrs: dim0, dim1
    RESHAPE = "reshape"        # shape from the node
    INDEX = "index"            # attrs: items; extra inputs are run-time indices
    UNINDEX = "unindex"        # attrs: items: zeros of the node's shape with the input placed where INDEX read
    GATHER = "gather"          # table, idx: table rows at integer indices: [*idx.shape, *table.shape[1:]]
    EXTERN = "extern"          # attrs: call, args (JSON), output: a PyTorch operator run eagerly (fallback="eager")
    # functions (before inlining)
    CALL = "call"              # attrs: func, dims (callee symbol -> caller dim); one output per PROJ
    PROJ = "proj"              # attrs: index: the index-th output of a CALL
    # many GPUs (passes/shard.py, ir/layout.py): identity within one process
    SHARD = "shard"            # attrs: dim: this value is split along dim over NUM_GPU (a local slice)
    ALL_GATHER = "all_gather"  # attrs: dim: the slices along dim, joined on every rank
    ALL_REDUCE = "all_reduce"  # attrs: reduce ("sum"): partial sums added up on every rank
    REDUCE_SCATTER = "reduce_scatter"  # attrs: dim: partial sums added up, each rank keeping its slice
    ALL_TO_ALL = "all_to_all"  # attrs: src, dim: split along dim instead of along src
    # pipeline stages (passes/stage.py, ir/stages.py): identity within one process
    STAGE = "stage"            # attrs: stage: from here on, the value is used on GPU `stage`; before
                               # passes/stage.py also (g, x) with no attr: g goes where x lives (a VJP)
    MICROBATCH = "microbatch"  # attrs: dim, parts: a pipeline splits this input into `parts` microbatches
                               # along dim (ir/microbatch.py)


UNARY = {Op.NEG, Op.NOT, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.SIGMOID, Op.TANH, Op.GELU, Op.SILU,
         Op.RELU, Op.ABS, Op.CAST, Op.ERF}
BINARY = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MOD, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND,
          Op.OR, Op.MAXIMUM, Op.MINIMUM}
COMPARE = {Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE}
REDUCE = {Op.SUM, Op.MEAN, Op.MAX, Op.MIN}
COLLECTIVE = {Op.SHARD, Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL, Op.STAGE, Op.MICROBATCH}


@dataclass(frozen=True)
class Node:
    id: int
    op: Op
    inputs: tuple[int, ...]
    dtype: str
    shape: Shape
    attrs: tuple[tuple[str, Any], ...] = ()     # sorted (key, value) pairs: hashable, canonical
    src: tuple | None = None                    # (line, col), or (line, col, module) if imported

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def key(self) -> str:
        """What makes two nodes compute the same value (for CSE)."""
        return json.dumps([self.op.value, list(self.inputs), self.dtype, list(self.shape),
                           [[k, v] for k, v in self.attrs]], sort_keys=True, separators=(",", ":"))


def attrs_of(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in kw.items() if v is not None or k in ("dim",)))


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


# Output trees: {"t": id} a tensor, {"tuple": [...]}, {"result": {"tag": id, "value": tree}}.
OutTree = dict


def tree_ids(tree: OutTree) -> list[int]:
    if "t" in tree:
        return [tree["t"]]
    if "tuple" in tree:
        return [i for item in tree["tuple"] for i in tree_ids(item)]
    return [tree["result"]["tag"], *tree_ids(tree["result"]["value"])]


def tree_map(tree: OutTree, fn) -> OutTree:
    if "t" in tree:
        return {"t": fn(tree["t"])}
    if "tuple" in tree:
        return {"tuple": [tree_map(t, fn) for t in tree["tuple"]]}
    return {"result": {"tag": fn(tree["result"]["tag"]), "value": tree_map(tree["result"]["value"], fn)}}


@dataclass(frozen=True)
class Graph:
    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[tuple[str, int], ...]        # (external name, INPUT node id), in signature order
    output: OutTree
    params: tuple[int, ...] = ()               # PARAM node ids, for function graphs

    def node(self, nid: int) -> Node:
        return self.by_id[nid]

    @property
    def by_id(self) -> dict[int, Node]:
        cached = self.__dict__.get("_by_id")
        if cached is None:
            cached = {n.id: n for n in self.nodes}
            object.__setattr__(self, "_by_id", cached)
        return cached

    def users(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n.id)
        return out

    def with_nodes(self, nodes: Iterable[Node], output: OutTree | None = None,
                   inputs: tuple[tuple[str, int], ...] | None = None) -> "Graph":
        return replace(self, nodes=tuple(nodes), output=self.output if output is None else output,
                       inputs=self.inputs if inputs is None else inputs)

    def symbols(self) -> set[str]:
        return {d for n in self.nodes for d in n.shape if isinstance(d, str)}


@dataclass(frozen=True)
class Program:
    main: Graph
    functions: dict[str, Graph] = field(default_factory=dict)
    num_gpu: int = 1                    # ranks the sharding pass plans for
    target: str | None = None           # the GPU profile (for the per-GPU memory check)

    def replace_main(self, main: Graph) -> "Program":
        return replace(self, main=main)


class GraphBuilder:
    """Appends nodes with fresh ids; used by lowering and by passes that rebuild graphs."""

    def __init__(self, name: str, start: int = 0) -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.next_id = start
        self.inputs: list[tuple[str, int]] = []
        self.params: list[int] = []

    def add(self, op: Op, inputs: Iterable[int], dtype: str, shape: Shape,
            attrs: tuple[tuple[str, Any], ...] = (), src: tuple[int, int] | None = None) -> int:
        nid = self.next_id
        self.next_id += 1
        self.nodes.append(Node(nid, op, tuple(inputs), dtype, tuple(shape), attrs, src))
        return nid

    def node(self, nid: int) -> Node:
        for n in reversed(self.nodes):
            if n.id == nid:
                return n
        raise KeyError(nid)

    def build(self, output: OutTree) -> Graph:
        return Graph(self.name, tuple(self.nodes), tuple(self.inputs), output, tuple(self.params))


def renumber(graph: Graph) -> Graph:
    """Give the nodes dense ids 0..n-1 in order: a canonical form (same program, same ids)."""
    mapping = {n.id: i for i, n in enumerate(graph.nodes)}
    nodes = tuple(replace(n, id=mapping[n.id], inputs=tuple(mapping[i] for i in n.inputs)) for n in graph.nodes)
    return replace(graph, nodes=nodes, inputs=tuple((name, mapping[i]) for name, i in graph.inputs),
                   output=tree_map(graph.output, mapping.__getitem__),
                   params=tuple(mapping[p] for p in graph.params))
