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
indices (check mode range-checks them after the run). Check mode checks indices that follow from
the shapes alone once per graph (`shape_only_gathers`).
"""

from __future__ import annotations

from ..compiler.codegen.launch_abi import ExternStep
from ..compiler.codegen.schedule import VIEWS
from ..compiler.ir.graph import COLLECTIVE, Graph, Node, Op, tree_ids
from ..dtypes import ITEMSIZE


def _roots(graph: Graph, nid: int, memo: dict[int, frozenset[int]], made: dict | None = None) -> frozenset[int]:
    """The non-view nodes whose memory node `nid`'s value reads. A view a step writes (an attention
    kernel's output written as its merged heads) is a root of its own."""
    if nid not in memo:
        n = graph.node(nid)
        memo[nid] = frozenset().union(*(_roots(graph, i, memo, made) for i in n.inputs)) \
            if n.op in VIEWS and n.inputs and not (made and nid in made) else frozenset({nid})
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
            for r in _roots(graph, nid, memo, made):
                last[r] = index
    kept: set[int] = set()
    for nid in tree_ids(graph.output):
        kept |= _roots(graph, nid, memo, made)
    for n in graph.nodes:
        if n.op is Op.GATHER:
            kept |= _roots(graph, n.inputs[1], memo, made)
    views: dict[int, list[int]] = {}
    for n in graph.nodes:
        if n.op in VIEWS and n.inputs and n.id not in made:
            for r in _roots(graph, n.id, memo, made):
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


def release(vals: dict, nids: tuple[int, ...], made: dict[int, tuple[int, int]], sources: dict | None = None) -> None:
    """Drop these node values from a run's `vals` (the executors' `frees` step); with `sources` (a
    launch recorder's pointer map), a dropped kernel output's address is forgotten, so a later
    output at the same address is named by its new maker."""
    for nid in nids:
        t = vals.pop(nid, None)
        if sources is not None and t is not None and nid in made and sources.get(t.data_ptr(), ("",))[0] == "out":
            del sources[t.data_ptr()]


def shape_only(graph: Graph, nid: int) -> bool:
    """Whether node `nid`'s value follows from the graph's shapes alone (IOTAs and constants through
    element-wise ops and views: no input, weight or random number): the same in every run of this
    graph, so its range needs checking once (a convolution's im2col indices)."""
    seen: set[int] = set()
    todo = [nid]
    while todo:
        n = graph.node(todo.pop())
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.op in (Op.IOTA, Op.CONST, Op.FULL):
            continue
        if not n.inputs or n.op in (Op.EXTERN, Op.RAND, Op.RANDN) or n.op in COLLECTIVE:
            return False
        todo.extend(n.inputs)
    return True


def computed_gathers(graph: Graph, verified: frozenset[int] = frozenset()) -> list[Node]:
    """The GATHERs whose indices the program computes (an engine input's are checked before the
    run), less those in `verified`."""
    found = []
    for n in graph.nodes:
        if n.op is not Op.GATHER or n.id in verified:
            continue
        src = graph.node(n.inputs[1])
        while src.op in (Op.RESHAPE, Op.TRANSPOSE) or (src.op is Op.INDEX and len(src.inputs) == 1):
            src = graph.node(src.inputs[0])
        if src.op is not Op.INPUT:
            found.append(n)
    return found


def shape_only_gathers(graph: Graph) -> frozenset[int]:
    """The GATHERs of `graph` whose indices follow from its shapes alone (`shape_only`)."""
    return frozenset(n.id for n in graph.nodes if n.op is Op.GATHER and shape_only(graph, n.inputs[1]))
