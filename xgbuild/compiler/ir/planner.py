"""The layout planner: the greedy core that the sharding pass and the microbatch plan share.

`Planner(graph, n).run()` gives each value of a graph planned for `n` pieces one layout
(ir/layout.py: R, S(d) or P) and inserts exactly one conversion op per (value, layout) where a
consumer needs another: SHARD (a local slice), ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER or
ALL_TO_ALL. Greedy: each node takes the layout cheapest for it, counted in bytes moved. A SHARD
node of the input graph is a split (`dim=None`: whole from here on); outputs never stay partial.
passes/shard.py plans `NUM_GPU` ranks with it (several ways, keeping the cheapest), and
ir/microbatch.py the microbatches of a pipeline (the pieces are microbatches there).
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.codes import SHARD_INDIVISIBLE
from .graph import Graph, Node, Op, attrs_of, tree_ids, tree_map
from .layout import P, R, Layout, S, nbytes, rules, shardable

INF = float("inf")


class ShardingError(Exception):
    """A plan that cannot work (found after checking): a code, a message, where, and help."""

    def __init__(self, code: str, message: str, src: tuple | None = None, help: str | None = None) -> None:
        super().__init__(message)
        self.code, self.src, self.help = code, src, help


class Planner:
    """One greedy plan of a graph for `n` pieces; `run()` gives the planned graph, and after it
    `convert` makes further conversions of its values (ir/microbatch.py makes outputs whole)."""

    def __init__(self, g: Graph, n: int, free: bool = False, leave: str = "never") -> None:
        self.g, self.n = g, n
        # free: a conversion made already, or an output's all-reduce, costs nothing; leave: where an
        # exact partial-sums-in, partial-sums-out rule may give way to a strictly cheaper one
        # ("never", "outputs", "anywhere"). passes/shard.py's best_plan tries the combinations.
        self.free, self.leave = free, leave
        self.nodes: list[Node] = []
        self.by_id: dict[int, Node] = {}
        self.layout: dict[int, Layout] = {}
        self.alias: dict[int, int] = {}
        self.converted: dict[tuple[int, Layout], int] = {}
        self.next_id = max((x.id for x in g.nodes), default=-1) + 1
        self.out_ids = set(tree_ids(g.output))

    def run(self) -> Graph:
        for node in self.g.nodes:
            node = replace(node, inputs=tuple(self.alias.get(i, i) for i in node.inputs))
            if node.op is Op.SHARD:       # dim None: a plan's "replicated" region wants it whole
                want = R if node.attr("dim") is None else S(node.attr("dim"))
                self.alias[node.id] = self.convert(node.inputs[0], want, node.src)
            elif node.op is Op.MEAN and self.mean_as_sum(node):
                continue
            else:
                self.place(node)
        out = tree_map(self.g.output, lambda i: self.alias.get(i, i))
        # Partial sums never leave: an output is whole on every rank, or split (gathered by the runtime).
        out = tree_map(out, lambda i: self.convert(i, R, None) if self.layout[i] == P else i)
        return self.g.with_nodes(self.nodes, out)

    # --- emitting -------------------------------------------------------------------------------
    def emit(self, node: Node, layout: Layout) -> int:
        self.nodes.append(node)
        self.by_id[node.id] = node
        self.layout[node.id] = layout
        return node.id

    def fresh(self, op: Op, inputs: tuple[int, ...], like: Node, layout: Layout, where, shape=None, **attrs) -> int:
        nid = self.next_id
        self.next_id += 1
        node = Node(nid, op, inputs, like.dtype, like.shape if shape is None else shape, attrs_of(**attrs), where)
        return self.emit(node, layout)

    def convert(self, vid: int, want: Layout, src) -> int:
        """`vid` laid out as `want`: itself, or one conversion op (made once per value and layout)."""
        have = self.layout[vid]
        if have == want:
            return vid
        key = (vid, want)
        if key not in self.converted and have == P and want.kind == "S" and vid in self.out_ids:
            # An output is all-reduced anyway: slice that (free) instead of a second reduction.
            self.converted[key] = self.convert(self.convert(vid, R, src), want, src)
        if key not in self.converted:
            x = self.by_id[vid]
            if want == R:
                op, attrs = (Op.ALL_REDUCE, {"reduce": "sum"}) if have == P else (Op.ALL_GATHER, {"dim": have.dim})
            elif have == R:
                op, attrs = Op.SHARD, {"dim": want.dim}
            elif have == P:
                op, attrs = Op.REDUCE_SCATTER, {"dim": want.dim}
            else:
                op, attrs = Op.ALL_TO_ALL, {"src": have.dim, "dim": want.dim}    # src: the old split dim
            if want.kind == "S" and not shardable(x.shape[want.dim], self.n):
                raise ShardingError(SHARD_INDIVISIBLE.code, SHARD_INDIVISIBLE.message.format(
                    dim=want.dim, name=_name(self.g, vid), size=x.shape[want.dim], num_gpu=self.n), src or x.src,
                    f"shard a dimension divisible by {self.n}, or change `NUM_GPU`")
            self.converted[key] = self.fresh(op, (vid,), x, want, src or x.src, **attrs)
        return self.converted[key]

    def cost(self, vid: int, want: Layout) -> float:
        have = self.layout[vid]
        if have == want or (have == R and want.kind == "S"):
            return 0.0      # nothing to move, or a local slice
        if self.free and ((vid, want) in self.converted or (have == P and want == R and vid in self.out_ids)):
            return 0.0      # a conversion made already, or an output's all-reduce (made anyway)
        if want == P:
            return INF
        share = _share(self.by_id[vid], self.n)
        if have.kind == "S" and want.kind == "S":
            return share / self.n
        return 2 * share if (have == P and want == R) else share

    # --- placing a node -------------------------------------------------------------------------
    def place(self, node: Node) -> None:
        have = tuple(self.layout[i] for i in node.inputs)
        ins = [self.by_id[i] for i in node.inputs]
        options = rules(node, ins, self.n)
        if not options:
            self.emit(node, R)
            return
        exact = next((out for want, out in options if want == have), None)
        # Partial sums in give partial sums out, as they are, unless `leave` lets a strictly
        # cheaper way take over (inputs reduced anyway, whose whole values combine for nothing).
        if exact is not None and (exact != P or self.leave == "never"
                                  or (self.leave == "outputs" and node.id not in self.out_ids)):
            self.emit(node, exact)
            return
        best = None
        for k, (want, out) in enumerate(options):
            c = sum(self.cost(i, w) for i, w in zip(node.inputs, want))
            if out == P:       # partial sums must be reduced later: count that now
                c += _share(node, self.n)
            rank = (c, {"S": 0, "P": 1, "R": 2}[out.kind], k)
            if best is None or rank < best[0]:
                best = (rank, want, out)
        _, want, out = best
        if exact is not None and best[0][0] >= _share(node, self.n):
            self.emit(node, exact)
            return
        inputs = tuple(self.convert(i, w, node.src) for i, w in zip(node.inputs, want))
        self.emit(replace(node, inputs=inputs), out)

    def mean_as_sum(self, node: Node) -> bool:
        """A mean over a split dim is a sum of partial sums times 1/count (the count is global)."""
        x = self.by_id[node.inputs[0]]
        lay = self.layout[x.id]
        dim = node.attr("dim")
        if lay.kind != "S" or (dim is not None and dim % len(x.shape) != lay.dim):
            return False
        dims = x.shape if dim is None else (x.shape[lay.dim],)
        if not all(isinstance(d, int) for d in dims) or not node.dtype.startswith(("float", "bfloat")):
            return False
        count = 1
        for d in dims:
            count *= d
        total = self.fresh(Op.SUM, node.inputs, node, P, node.src, shape=node.shape, dim=dim,
                           keepdim=node.attr("keepdim", False) or None)
        scale = self.fresh(Op.CONST, (), node, R, node.src, shape=(), value=1.0 / count)
        self.alias[node.id] = self.fresh(Op.MUL, (total, scale), node, P, node.src)
        return True


def _name(g: Graph, vid: int) -> str:
    return next((name for name, i in g.inputs if i == vid), f"%{vid}")


def _share(node: Node, n: int) -> float:
    """Bytes of `node` a GPU must receive to hold it whole when it holds 1/n of it (symbolic sizes guessed)."""
    size = nbytes(node, guess=True)
    return size * (n - 1) / n if size else 0.0
