"""The stage pass: pipeline placement (ir/stages.py) made final.

Needs: an inlined main graph with STAGE(x, stage=k) nodes (a pipeline plan's regions, placed by
lowering) and autodiff's STAGE(g, x) nodes (in a staged program, the gradient of each node x is
computed where x runs, so the backward pass mirrors the forward one's placement).

Leaves: only STAGE(x, stage=k) nodes: each STAGE(g, x) becomes STAGE(g, stage=<x's GPU>), or is
dropped when x is free (an input: the gradient stays where it was computed) or g is there already. With `NUM_GPU = 1`
every STAGE node is dropped. A staged graph splits nothing (XG0507 for a SHARD beside a stage):
`ir/stages.py` reads the placement back from the graph alone.
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.codes import PLAN_PIPELINE
from ..ir.graph import Graph, Op, Program, attrs_of, tree_ids, tree_map
from ..ir.layout import nbytes
from ..ir.stages import has_stages, infer_stages, stage_plan
from .shard import ShardingError


def stage(program: Program) -> Program:
    g = program.main
    if not has_stages(g):
        return program
    shard = next((n for n in g.nodes if n.op is Op.SHARD and n.attr("dim") is not None), None)
    if shard is not None:
        raise ShardingError(PLAN_PIPELINE.code, PLAN_PIPELINE.fmt(
            detail="a pipeline plan beside a split value (`with shard(x, dim=...)` or a data/tensor region)"),
            shard.src, "a pipeline plan places whole regions on GPUs; splitting inside a stage is not supported yet")
    st = infer_stages(g) if program.num_gpu > 1 else {}
    alias: dict[int, int] = {}
    nodes = []
    for n in g.nodes:
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        if n.op is Op.STAGE:
            k = st.get(n.id)
            if k is None or (n.attr("stage") is None and st.get(n.inputs[0]) == k):
                alias[n.id] = n.inputs[0]          # free, or a gradient already where it belongs
                continue
            n = replace(n, inputs=n.inputs[:1], attrs=attrs_of(stage=k))
        nodes.append(n)
    return replace(program, main=g.with_nodes(nodes, tree_map(g.output, lambda i: alias.get(i, i))))


def stage_footprint(graph: Graph, world: int) -> list[dict]:
    """Bytes each GPU holds: the inputs it reads and the peak of the values alive at once while it
    runs its nodes (a received value from its first use here, or at the end for an output; each
    value is freed after its last use here, a value only sent once it is sent)."""
    out = []
    outputs = set(tree_ids(graph.output))
    for rank in range(world):
        plan = stage_plan(graph, rank, world)
        order = plan.run
        last: dict[int, int] = {}
        for k, nid in enumerate(order):
            for i in graph.node(nid).inputs:
                last[i] = k
        size = {i: nbytes(graph.node(i)) or 0 for i in [*order, *plan.recv]}
        first: dict[int, int] = {}
        for k, nid in enumerate(order):
            for i in graph.node(nid).inputs:
                if i in plan.recv:
                    first.setdefault(i, k)
        inputs = sum(size[i] for i in order if graph.node(i).op is Op.INPUT)
        live = peak = 0
        for k, nid in enumerate(order):
            node = graph.node(nid)
            live += sum(size[i] for i in set(node.inputs) if first.get(i) == k)    # arrives for its first use
            if node.op is not Op.INPUT:
                live += size[nid]
            peak = max(peak, live)
            for i in set(node.inputs):
                if last.get(i) == k and graph.node(i).op is not Op.INPUT and i not in outputs:
                    live -= size[i]
            if nid not in last and nid in plan.send and nid not in outputs and node.op is not Op.INPUT:
                live -= size[nid]
        peak = max(peak, live + sum(size[i] for i in plan.recv if i not in first))    # outputs, at the end
        out.append({"inputs": inputs, "activations": peak, "total": inputs + peak})
    return out
