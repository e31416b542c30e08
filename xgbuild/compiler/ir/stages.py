"""Pipeline stages: which GPU runs each node of a staged graph, and what moves between them.

A pipeline plan (`strategy = "pipeline"` regions of a `--sharding` file) puts a STAGE(x, stage=k)
node on each value a region reads: from there on x is used on GPU k. Placement follows the data:

- a STAGE node is on its stage;
- a node with placed inputs runs on the latest stage among them (data flows to later stages);
- a node with none (inputs, constants, and what is computed from them alone) is *free*: every
  GPU that needs it computes it (or loads it) itself, so nothing is sent for it.

Before `passes/stage.py` a STAGE(g, x) node (no `stage` attr; autodiff's rule for a STAGE) sends a
gradient back to wherever x lives; the pass turns it into STAGE(g, stage=k) or drops it, so a
compiled engine holds only the first kind and `infer_stages` reads the plan back from the graph.

`stage_plan` turns placement into what one rank does: the nodes it runs (in graph order) and the
transfers between each pair of GPUs, in one order every rank agrees on (the graph order of the
value sent), so point-to-point sends and receives pair up without deadlock. Outputs go to rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .graph import Graph, Op, tree_ids


def has_stages(graph: Graph) -> bool:
    return any(n.op is Op.STAGE for n in graph.nodes)


def infer_stages(graph: Graph) -> dict[int, int | None]:
    """Node id -> the GPU that runs it, or None for a free node (computed wherever it is used)."""
    st: dict[int, int | None] = {}
    for n in graph.nodes:
        if n.op is Op.STAGE:
            st[n.id] = n.attr("stage") if n.attr("stage") is not None else st[n.inputs[1]]
            continue
        placed = [st[i] for i in n.inputs if st[i] is not None]
        st[n.id] = max(placed) if placed else None
    return st


@dataclass(frozen=True)
class Transfer:
    value: int          # the node id sent
    src: int            # the rank that computes it
    dst: int            # the rank that reads it
    seq: int            # its place among the transfers between src and dst (both directions)


@dataclass
class RankPlan:
    """One rank's part of a staged graph."""
    rank: int
    run: list[int]                                     # node ids this rank computes, graph order
    recv: dict[int, Transfer] = field(default_factory=dict)    # value -> how it arrives here
    send: dict[int, list[Transfer]] = field(default_factory=dict)   # value -> where it goes
    pairs: dict[int, list[Transfer]] = field(default_factory=dict)  # peer -> transfers, agreed order


def stage_plan(graph: Graph, rank: int, world: int) -> RankPlan:
    st = infer_stages(graph)
    outputs = tree_ids(graph.output)
    pos = {n.id: k for k, n in enumerate(graph.nodes)}
    # Every (value, src, dst) that crosses GPUs: a placed value read by a node on another GPU, or
    # an output computed away from rank 0.
    crossings: set[tuple[int, int, int]] = set()
    for n in graph.nodes:
        here = st[n.id]
        if here is None:
            continue
        for i in n.inputs:
            if st[i] is not None and st[i] != here:
                crossings.add((i, st[i], here))
    for i in outputs:
        if st[i] not in (None, 0):
            crossings.add((i, st[i], 0))
    by_pair: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for v, a, b in sorted(crossings, key=lambda c: (pos[c[0]], c[2])):
        by_pair.setdefault((min(a, b), max(a, b)), []).append((v, a, b))
    plan = RankPlan(rank, [])
    for (lo, hi), items in by_pair.items():
        if rank not in (lo, hi):
            continue
        peer = hi if rank == lo else lo
        seq = [Transfer(v, a, b, k) for k, (v, a, b) in enumerate(items)]
        plan.pairs[peer] = seq
        for t in seq:
            if t.dst == rank:
                plan.recv[t.value] = t
            else:
                plan.send.setdefault(t.value, []).append(t)
    # What this rank computes: its own nodes, and the free nodes they (or, on rank 0, the outputs) read.
    need: set[int] = set()
    stack = [n.id for n in graph.nodes if st[n.id] == rank]
    if rank == 0:
        stack += [i for i in outputs if st[i] is None]
    while stack:
        i = stack.pop()
        if i in need:
            continue
        need.add(i)
        if st[i] is None or st[i] == rank:
            stack.extend(j for j in graph.node(i).inputs if j not in plan.recv)
    plan.run = [n.id for n in graph.nodes if n.id in need and n.id not in plan.recv]
    return plan


def stage_summary(graph: Graph, world: int) -> dict:
    """The placement as data (manifest, inspect, --emit ir-opt): nodes per GPU and what each
    pair of GPUs sends, in bytes."""
    from .layout import nbytes
    st = infer_stages(graph)
    nodes = [sum(1 for n in graph.nodes if st[n.id] == k and n.op is not Op.STAGE) for k in range(world)]
    free = sum(1 for n in graph.nodes if st[n.id] is None and n.op not in (Op.INPUT, Op.CONST))
    sends = []
    for a in range(world):
        plan = stage_plan(graph, a, world)
        for v, ts in plan.send.items():
            for t in ts:
                node = graph.node(v)
                sends.append({"id": v, "from": t.src, "to": t.dst, "bytes": nbytes(node),
                              "line": node.src[0] if node.src else None})
    sends.sort(key=lambda s: (s["from"], s["to"], s["id"]))
    known = [s["bytes"] for s in sends if s["bytes"] is not None]
    return {"stages": world, "nodes": nodes, "free_nodes": free, "transfers": sends,
            "bytes_moved": sum(known), "bytes_unknown": len(known) != len(sends)}
