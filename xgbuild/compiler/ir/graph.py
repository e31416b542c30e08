"""The Graph IR: one `Node` type with an `Op` enum, in topological order.

A node is an SSA value: op, input node ids, dtype, shape (ints, or symbol names for dims known
only at run time), attributes, and the source position it came from (for NaN reports). A `Graph`
has named inputs and an output tree (tensors, tuples and results built from node ids). A
`Program` holds `main` and, before inlining, the functions it calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable

from ..ops import BINARY, COLLECTIVE, COMPARE, REDUCE, UNARY, Dim, Op, Shape, attrs_of  # noqa: F401 (the IR's vocabulary)

if TYPE_CHECKING:
    from ...hw import GpuProfile


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
    target: str | None = None           # the GPU profile's name (for the per-GPU memory check)
    # The mixed-precision policy's dtype (`COMPUTE = bfloat16`), applied by passes/precision.py;
    # None: products compute in the dtype they are written in.
    compute: str | None = None
    # The loaded profile of `target`, set by whoever builds the Program with one in hand (the
    # driver, the importers), so a custom hw directory reaches the passes. Not part of the
    # program's identity: never compared, printed or serialised.
    profile: "GpuProfile | None" = field(default=None, compare=False, repr=False)

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
        self._index: dict[int, int] = {}        # node id -> position in `nodes`, for `node()`
        self._indexed_list: list[Node] | None = None
        self._indexed = 0

    def add(self, op: Op, inputs: Iterable[int], dtype: str, shape: Shape,
            attrs: tuple[tuple[str, Any], ...] = (), src: tuple[int, int] | None = None) -> int:
        nid = self.next_id
        self.next_id += 1
        self.nodes.append(Node(nid, op, tuple(inputs), dtype, tuple(shape), attrs, src))
        return nid

    def node(self, nid: int) -> Node:
        # An index by id, brought up to date on demand: a scan per lookup made autodiff of a
        # 5,000-statement function quadratic (minutes). `nodes` only grows, but a pass may
        # assign a new list (autodiff does): then the index starts over.
        index = self._index
        if self._indexed_list is not self.nodes:
            index.clear()
            self._indexed_list, self._indexed = self.nodes, 0
        if nid not in index:
            for pos in range(self._indexed, len(self.nodes)):
                index[self.nodes[pos].id] = pos
            self._indexed = len(self.nodes)
        pos = index.get(nid)
        if pos is None:
            raise KeyError(nid)
        return self.nodes[pos]

    def build(self, output: OutTree) -> Graph:
        return Graph(self.name, tuple(self.nodes), tuple(self.inputs), output, tuple(self.params))


def renumber(graph: Graph) -> Graph:
    """Give the nodes dense ids 0..n-1 in order: a canonical form (same program, same ids)."""
    mapping = {n.id: i for i, n in enumerate(graph.nodes)}
    nodes = tuple(replace(n, id=mapping[n.id], inputs=tuple(mapping[i] for i in n.inputs)) for n in graph.nodes)
    return replace(graph, nodes=nodes, inputs=tuple((name, mapping[i]) for name, i in graph.inputs),
                   output=tree_map(graph.output, mapping.__getitem__),
                   params=tuple(mapping[p] for p in graph.params))
