"""The stage pass: pipeline placement (ir/stages.py) made final.

Needs: an inlined main graph with STAGE(x, stage=k) nodes (a pipeline plan's regions, placed by
lowering) and autodiff's STAGE(g, x) nodes (in a staged program, the gradient of each node x is
computed where x runs, so the backward pass mirrors the forward one's placement).

Leaves: only STAGE(x, stage=k) nodes: each STAGE(g, x) becomes STAGE(g, stage=<x's GPU>), or is
dropped when x is free (an input: the gradient stays where it was computed) or g is there
already; every STAGE node carries the stages' GPUs. With `NUM_GPU = 1` every STAGE and MICROBATCH
node is dropped. A staged graph splits nothing but the batch (XG0507 for a SHARD beside a stage):
`ir/stages.py` reads the placement back from the graph alone.
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.codes import PLAN_PIPELINE
from ..ir.graph import Graph, Op, Program, attrs_of, tree_map
from ..ir.layout import nbytes
from ..ir.microbatch import microbatch_graph
from ..ir.planner import ShardingError
from ..ir.stages import batch_split, has_stages, infer_stages, stage_gpus, stage_plans, stage_replicas


def stage(program: Program) -> Program:
    g = program.main
    if not has_stages(g):
        return program
    shard = next((n for n in g.nodes if n.op is Op.SHARD and n.attr("dim") is not None), None)
    if shard is not None:
        raise ShardingError(PLAN_PIPELINE.code, PLAN_PIPELINE.fmt(
            detail="a pipeline plan beside a split value (`with shard(x, dim=...)` or a data/tensor region)"),
            shard.src, "a pipeline plan places whole regions on stages; a stage of several GPUs splits the "
            "`[pipeline] split` batch over them, and nothing else is split inside a stage yet")
    st = infer_stages(g) if program.num_gpu > 1 else {}
    gpus = stage_gpus(g)
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
            n = replace(n, inputs=n.inputs[:1], attrs=attrs_of(stage=k, gpus=gpus))
        nodes.append(n)
    g = g.with_nodes(nodes, tree_map(g.output, lambda i: alias.get(i, i)))
    if program.num_gpu > 1:
        microbatch_graph(g, stage_replicas(g))    # the microbatch plan must work (a dim the count does not divide: XG0500)
    return replace(program, main=g)


def stage_footprint(graph: Graph) -> list[dict]:
    """Bytes each GPU of each stage holds: the inputs it reads (its replica's share of the batch)
    and the peak of the values alive at once while it runs its tasks, as the runtime does
    (runtime/spmd.py): a receive's buffer from when it is posted (when a task needs it, or a later
    transfer of its pair is posted), each value freed once this GPU's tasks have read it and its
    sends are posted; outputs are kept. A combination over microbatches also holds what it is made
    from: a sum's running sum (from its first addend; or the stacked addends, where they are read
    elsewhere too), the replicas' pieces of a join, and (re-split for every microbatch) the whole
    value, from its first microbatch's piece to its last."""
    out = []
    names = {nid: name for name, nid in graph.inputs}
    shared = batch_split(graph)
    for plan in stage_plans(graph):
        g = plan.graph
        size = lambda key: nbytes(g.node(key[0])) or 0       # noqa: E731
        cursor = {peer: 0 for peer in plan.pairs}
        live = peak = held = 0

        def post(peer: int, upto: int) -> int:
            added = 0
            while cursor[peer] <= upto:
                t = plan.pairs[peer][cursor[peer]]
                cursor[peer] += 1
                if t.dst == plan.rank:
                    added += size(t.key)
            return added
        inputs = sum(size((nid, m)) // (plan.replicas if names.get(nid) in shared else 1)
                     for nid, m in plan.tasks if g.node(nid).op is Op.INPUT)
        running: dict[int, int] = {}                     # addend node -> bytes of its running sum
        for step in plan.steps():
            here, m = step.key, step.mb
            live += sum(post(peer, upto) for peer, upto in step.posts)
            if g.node(step.node).op is not Op.INPUT:
                live += size(here)
            live += sum(post(peer, upto) for peer, upto in step.sends)
            second = step.into is not None and step.node in running and m == 1
            if step.into is not None and step.node not in running:
                # The first addend starts the running sum (16-bit addends are summed in float32).
                wide = 2 if g.node(step.node).dtype in ("float16", "bfloat16") else 1
                running[step.node] = size(here) * wide
                held += running[step.node]
            extra, whole = _combining(g.node(step.node), m, size(here), plan, step.summed is not None)
            if second:      # the second addend makes the sum anew, beside the first one
                extra += running[step.node]
            held += whole if m in (0, None) else 0
            peak = max(peak, live + held + extra)
            if m is not None and m == plan.parts - 1:
                held -= whole
            if step.summed is not None and (m is None or m == plan.parts - 1):
                held -= running.pop(step.summed)
            live -= sum(size(key) for key in step.frees if g.node(key[0]).op is not Op.INPUT)
        for peer, seq in plan.pairs.items():              # outputs arriving at the end
            live += post(peer, len(seq) - 1)
        peak = max(peak, live)
        out.append({"inputs": inputs, "activations": peak, "total": inputs + peak})
    return out


def _combining(node, m: int | None, size: int, plan, summed: bool) -> tuple[int, int]:
    """What a combination over microbatches holds beside its result (runtime/spmd.py): (bytes for
    this task only, bytes of a whole value kept from its first microbatch's piece to its last).
    `summed`: a sum that reads the running sum of its addends (counted where they are made)."""
    d, pieces = plan.replicas, plan.parts * plan.replicas
    if node.op is Op.ALL_REDUCE:
        return (0 if summed else size * plan.parts), 0     # the addends, stacked
    if node.op is Op.REDUCE_SCATTER and summed:
        return 0, (size * pieces if d > 1 else 0)     # D > 1: the replicas' sum, kept for every piece
    if node.op is Op.ALL_GATHER:
        return (size if d > 1 else 0), 0            # the replicas' pieces arrive beside the join
    if node.op in (Op.REDUCE_SCATTER, Op.ALL_TO_ALL):
        if d > 1:                                   # made once, re-split for each microbatch
            return (size * pieces if node.op is Op.ALL_TO_ALL else 0), size * pieces
        return size * pieces, 0                     # made again for each microbatch
    return 0, 0
