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
from ..ir.microbatch import microbatch_graph, microbatches
from ..ir.stages import has_stages, infer_stages, stage_plans
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
        if n.op is Op.MICROBATCH and program.num_gpu == 1:
            alias[n.id] = n.inputs[0]               # one GPU: the whole batch at once
            continue
        if n.op is Op.STAGE:
            k = st.get(n.id)
            if k is None or (n.attr("stage") is None and st.get(n.inputs[0]) == k):
                alias[n.id] = n.inputs[0]          # free, or a gradient already where it belongs
                continue
            n = replace(n, inputs=n.inputs[:1], attrs=attrs_of(stage=k))
        nodes.append(n)
    g = g.with_nodes(nodes, tree_map(g.output, lambda i: alias.get(i, i)))
    if program.num_gpu > 1:
        try:
            microbatch_graph(g)    # the microbatch plan must work (a dim the count does not divide: XG0500)
        except ShardingError as exc:
            parts = microbatches(g)
            text = str(exc).replace(f"`NUM_GPU = {parts}`", f"{parts} microbatches")
            raise ShardingError(exc.code, f"{text} (planning the pipeline's microbatches)", exc.src,
                                "choose a number of microbatches that divides it") from None
    return replace(program, main=g)


def stage_footprint(graph: Graph, world: int) -> list[dict]:
    """Bytes each GPU holds: the inputs it reads and the peak of the values alive at once while it
    runs its tasks, microbatch by microbatch (a received value from its first use here, or at the
    end for an output; each value is freed after its last use here, a value only sent once it is
    sent)."""
    out = []
    for plan in stage_plans(graph, world):
        g = plan.graph
        outputs = {(i, None) for i in tree_ids(g.output)}
        size = {}
        last: dict = {}
        first: dict = {}
        for k, (nid, m) in enumerate(plan.tasks):
            size[(nid, m)] = nbytes(g.node(nid)) or 0
            for key in plan.needs(nid, m):
                last[key] = k
                if key in plan.recv:
                    first.setdefault(key, k)
        for key in plan.recv:
            size[key] = nbytes(g.node(key[0])) or 0
        inputs = sum(size[(nid, m)] for nid, m in plan.tasks if g.node(nid).op is Op.INPUT)
        live = peak = 0
        for k, (nid, m) in enumerate(plan.tasks):
            here = (nid, m)
            reads = set(plan.needs(nid, m))
            live += sum(size[key] for key in reads if first.get(key) == k)     # arrives for its first use
            if g.node(nid).op is not Op.INPUT:
                live += size[here]
            peak = max(peak, live)
            for key in reads:
                if last.get(key) == k and g.node(key[0]).op is not Op.INPUT and key not in outputs:
                    live -= size[key]
            if here not in last and here in plan.send and here not in outputs and g.node(nid).op is not Op.INPUT:
                live -= size[here]
        peak = max(peak, live + sum(size[key] for key in plan.recv if key not in first))   # outputs, at the end
        out.append({"inputs": inputs, "activations": peak, "total": inputs + peak})
    return out
