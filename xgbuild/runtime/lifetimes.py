"""When a run can let go of each value its kernels made: after the last launch that reads it.

The executor (`gpu.KernelExecutor`) holds every node's value in `Values` for the run. Kept to the
end, a run's peak memory is the sum of all its intermediates: a GPT-2-small training step held
53 GB on an H200 where `torch.compile`'s held 8.8 GB. Dropped after their last reader (torch's
caching allocator, or the deploy runtime's stream-ordered pool, hands the block to the next
kernel's output, and a CUDA graph's capture reuses it inside its own pool), the peak is what is
live at once.

A value made by a kernel (or a PyTorch operator) is a root; a view (reshape, transpose, slice,
a collective within one process) reads its roots' memory, so reading a view reads its roots. A
root is never dropped when the graph's outputs view it, nor when it holds a GATHER's computed
indices (check mode range-checks them after the run).
"""

from __future__ import annotations

from ..compiler.codegen.launch_abi import ExternStep
from ..compiler.codegen.schedule import VIEWS
from ..compiler.ir.graph import Graph, Op, tree_ids
from ..dtypes import ITEMSIZE


def _roots(graph: Graph, nid: int, memo: dict[int, frozenset[int]]) -> frozenset[int]:
    """The non-view nodes whose memory node `nid`'s value reads."""
    if nid not in memo:
        n = graph.node(nid)
        memo[nid] = frozenset().union(*(_roots(graph, i, memo) for i in n.inputs)) \
            if n.op in VIEWS and n.inputs else frozenset({nid})
    return memo[nid]


def frees(graph: Graph, plans: list, made: dict[int, tuple[int, int]]) -> list[tuple[int, ...]]:
    """Per plan step, the nodes whose values the run drops once that step is launched: each root
    made by a step whose last reader that is (or that made it, when nothing reads it), with every
    view node over it (cached views hold its memory too)."""
    memo: dict[int, frozenset[int]] = {}
    last: dict[int, int] = {}
    for index, plan in enumerate(plans):
        reads = graph.node(plan.node).inputs if isinstance(plan, ExternStep) else plan.binding.operands
        for nid in reads:
            for r in _roots(graph, nid, memo):
                last[r] = index
    kept: set[int] = set()
    for nid in tree_ids(graph.output):
        kept |= _roots(graph, nid, memo)
    for n in graph.nodes:
        if n.op is Op.GATHER:
            kept |= _roots(graph, n.inputs[1], memo)
    views: dict[int, list[int]] = {}
    for n in graph.nodes:
        if n.op in VIEWS and n.inputs:
            for r in _roots(graph, n.id, memo):
                views.setdefault(r, []).append(n.id)
    out: list[list[int]] = [[] for _ in plans]
    for nid, (index, _pos) in made.items():
        if nid in kept:
            continue
        at = max(index, last.get(nid, index))
        out[at] += [nid, *views.get(nid, ())]
    return [tuple(x) for x in out]


def peak_bytes(graph: Graph, plans: list, made: dict[int, tuple[int, int]], dropped: list[tuple[int, ...]] | None
               ) -> int:
    """The most bytes of step outputs alive at once over a run (inputs and constants left out):
    with `dropped` (`frees`) as the executor lets go of them, without (None) as if all were kept."""
    size: dict[int, int] = {}
    for nid in made:
        n = graph.node(nid)
        count = 1
        for d in n.shape:
            count *= int(d)
        size[nid] = count * ITEMSIZE[n.dtype]
    alive = peak = 0
    by_step: dict[int, list[int]] = {}
    for nid, (index, _pos) in made.items():
        by_step.setdefault(index, []).append(nid)
    for index in range(len(plans)):
        alive += sum(size[nid] for nid in by_step.get(index, ()))
        peak = max(peak, alive)
        if dropped is not None:
            alive -= sum(size[nid] for nid in dropped[index] if nid in size)
    return peak
