"""Microbatches for a pipeline: the batch split in time instead of over GPUs.

A pipeline plan's `[pipeline] microbatches = M` with `split = { X = 0 }` puts a
MICROBATCH(x, dim=d, parts=M) marker on each split input (identity in one process: the whole
batch at once gives the same result). For a pipeline run, `microbatch_graph` plans the program as
if M ranks each held one microbatch, with the sharding pass's own rules (ir/layout.py) and
planner (ir/planner.py): the markers are splits, a value is R (whole: computed once), S(d) (one
piece per microbatch) or P (one addend per microbatch: a weight gradient), and the planner's
conversions become combinations over microbatches:

| conversion | over microbatches |
| --- | --- |
| shard (R -> S) | piece m of the whole value, for microbatch m |
| all_gather (S -> R) | the pieces joined, once all are done |
| all_reduce (P -> R) | the addends summed (gradient accumulation), once all are done |
| reduce_scatter (P -> S) | the sum's piece m |
| all_to_all (S(a) -> S(b)) | the pieces joined along a, split along b |

Outputs are made whole. The graph returned has each node's shape for one microbatch (per-m
nodes) or the whole value (once nodes); `per_microbatch` says which nodes run M times. It exists
only at run time (and for `inspect`): the engine stores the unsplit graph.

With stages of D GPUs (ir/stages.py) the batch is split in time and over the stage's GPUs: the
plan is made for M * D pieces, replica d holding pieces d*M to d*M + M - 1, so each combination
combines the replica's own pieces and then the replicas' (a collective inside the stage).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .graph import Graph, Op, attrs_of, tree_map
from .layout import R, infer_layouts, local_shape
from .planner import Planner, ShardingError

def microbatches(graph: Graph) -> int:
    """The graph's microbatch count (1: none)."""
    parts = {n.attr("parts") for n in graph.nodes if n.op is Op.MICROBATCH}
    if len(parts) > 1:
        raise ValueError(f"microbatch markers disagree on the count: {sorted(parts)}")
    return parts.pop() if parts else 1


@dataclass(frozen=True)
class Microbatched:
    graph: Graph                 # per-microbatch shapes; the sharding pass's conversions act over microbatches
    parts: int                   # microbatches per replica
    per_microbatch: frozenset    # node ids run once per microbatch (the rest run once)
    schedule: str = "1f1b"       # "1f1b" | "gpipe" (ir/stages.py)
    replicas: int = 1            # GPUs per stage: the plan is over parts * replicas pieces


def microbatch_graph(graph: Graph, replicas: int = 1) -> Microbatched:
    """The plan over microbatches for `replicas` GPUs per stage (ir/stages.py's `stage_replicas`); raises
    ShardingError, worded in microbatches, for a size the count does not divide."""
    parts = microbatches(graph)
    if parts * replicas == 1:
        return Microbatched(graph, 1, frozenset())
    # No marker left (the program never reads its `split` inputs): nothing is split, and every
    # replica computes the same whole values.
    schedule = next((n.attr("schedule", "1f1b") for n in graph.nodes if n.op is Op.MICROBATCH), "1f1b")
    pieces = parts * replicas
    # The markers become the sharding pass's splits, over `parts` virtual ranks.
    marked = graph.with_nodes([replace(n, op=Op.SHARD, attrs=attrs_of(dim=n.attr("dim")))
                               if n.op is Op.MICROBATCH else n for n in graph.nodes])
    planner = Planner(marked, pieces)
    try:
        planned = planner.run()
        whole = tree_map(planned.output, lambda i: planner.convert(i, R, None))
    except ShardingError as exc:
        what = f"{parts} microbatches" if replicas == 1 else (
            f"{pieces} pieces ({parts} microbatch{'es' if parts > 1 else ''} x {replicas} GPUs per stage)")
        text = str(exc).replace(f"`NUM_GPU = {pieces}` does not divide", f"{what} do not divide")
        raise ShardingError(exc.code, f"{text} (planning the pipeline's microbatches)", exc.src,
                            "choose a number of microbatches that divides it" if replicas == 1 else
                            "choose microbatches and GPUs per stage whose product divides it") from None
    planned = planned.with_nodes(planner.nodes, whole)
    layouts = infer_layouts(planned, pieces)
    nodes = [replace(n, shape=local_shape(n.shape, layouts[n.id], pieces)) for n in planned.nodes]
    per = frozenset(n.id for n in planned.nodes if layouts[n.id] != R)
    return Microbatched(planned.with_nodes(nodes, whole), parts, per, schedule, replicas)
