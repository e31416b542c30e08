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

Each STAGE node also carries every stage's GPUs (`gpus`, from the plan; without it, stage k is
GPU k). A stage of D GPUs runs data parallel: D replicas of the whole pipeline, replica d on GPU d
of every stage, each with its share of the batch (`batch_split`); ir/microbatch.py plans the
microbatches of all replicas together, so the values that combine microbatches (joins, gradient
sums) combine the replicas' too, by collectives inside each stage.

`stage_plans` turns placement into what each stage does: its tasks (a node, for one microbatch or
once) and the transfers between each pair of stages, in one order both sides agree on (the time of
each send in a step-by-step simulation of all stages), so point-to-point sends and receives pair
up without deadlock. Every replica runs its stage's plan, with its own peers. Outputs go to stage
0 (rank 0 reports replica 0's). `stage_inputs` names the inputs a rank reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .graph import Graph, Op, tree_ids
from .layout import nbytes
from .microbatch import microbatch_graph


def has_stages(graph: Graph) -> bool:
    return any(n.op is Op.STAGE for n in graph.nodes)


def stage_gpus(graph: Graph) -> tuple[tuple[int, ...], ...]:
    """Each stage's GPUs (ranks), in stage order; replica d of the pipeline runs on the d-th GPU of
    every stage."""
    most = -1
    for n in graph.nodes:
        if n.op is Op.STAGE:
            if n.attr("gpus") is not None:
                return n.attr("gpus")
            most = max(most, n.attr("stage") if n.attr("stage") is not None else -1)
    return tuple((k,) for k in range(most + 1))


def stage_replicas(graph: Graph) -> int:
    """GPUs per stage: the data-parallel replicas of the pipeline (1 without stages)."""
    return len(stage_gpus(graph)[0]) if has_stages(graph) else 1


def stage_of(graph: Graph, rank: int) -> tuple[int, int] | None:
    """(stage, replica) of a rank in a staged graph; None for a GPU in no stage."""
    for k, gpus in enumerate(stage_gpus(graph)):
        if rank in gpus:
            return k, gpus.index(rank)
    return None


def batch_split(graph: Graph) -> dict[str, int]:
    """With stages of several GPUs: the inputs that hold the batch (the plan's `[pipeline] split`),
    name -> dim, where nothing else reads them; each replica reads only its share (a 1/D slice, in
    replica order)."""
    if len(stage_gpus(graph)[0] if has_stages(graph) else ()) < 2:
        return {}
    users = graph.users()
    out = {}
    for name, nid in graph.inputs:
        marks = {graph.node(u).attr("dim") if graph.node(u).op is Op.MICROBATCH else None for u in users[nid]}
        if len(marks) == 1 and None not in marks and nid not in tree_ids(graph.output):
            out[name] = marks.pop()
    return out


def rank_share(graph: Graph, rank: int) -> tuple[dict[str, int], int, int]:
    """What a pipeline rank loads a slice of: (input -> dim, its piece, of how many pieces)."""
    where = stage_of(graph, rank)
    replicas = len(stage_gpus(graph)[0])
    return (batch_split(graph), where[1], replicas) if where is not None else ({}, 0, 1)


def infer_stages(graph: Graph) -> dict[int, int | None]:
    """Node id -> the stage that runs it, or None for a free node (computed wherever it is used)."""
    st: dict[int, int | None] = {}
    for n in graph.nodes:
        if n.op is Op.STAGE:
            st[n.id] = n.attr("stage") if n.attr("stage") is not None else st[n.inputs[1]]
            continue
        placed = [st[i] for i in n.inputs if st[i] is not None]
        st[n.id] = max(placed) if placed else None
    return st


def _computed_on(graph: Graph, st: dict[int, int | None], rank: int) -> set[int]:
    """The nodes `rank` computes: its own, and the free ones they read (rank 0 also computes the
    outputs that are free)."""
    need = {n.id for n in graph.nodes if st[n.id] == rank}
    stack = [j for i in need for j in graph.node(i).inputs if st[j] is None]
    if rank == 0:
        stack += [i for i in tree_ids(graph.output) if st[i] is None]
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(graph.node(i).inputs)      # a free node's inputs are free too
    return need


def stage_inputs(graph: Graph, rank: int) -> set[str]:
    """The inputs rank `rank` of a staged graph reads (directly or through free nodes): the only
    ones it loads (split ones: its replica's share, `batch_split`)."""
    where = stage_of(graph, rank)
    if where is None:
        return set()
    need = _computed_on(graph, infer_stages(graph), where[0])
    return {name for name, nid in graph.inputs if nid in need}


Key = tuple    # (node id, microbatch) in the microbatched graph; microbatch None: a value made once


@dataclass(frozen=True)
class Transfer:
    value: int          # the node id sent (in the microbatched graph)
    mb: int | None      # its microbatch (None: a value made once)
    src: int            # the rank that computes it
    dst: int            # the rank that reads it
    seq: int            # its place among the transfers between src and dst (both directions)

    @property
    def key(self) -> Key:
        return (self.value, self.mb)


@dataclass
class RankPlan:
    """One stage's part of a staged graph (`graph`: microbatched, ir/microbatch.py), which each of
    the stage's GPUs runs on its replica's share; peers in `recv`/`send`/`pairs` are stages."""
    rank: int                                          # the stage
    graph: Graph
    parts: int                                         # microbatches per replica (1: none)
    per_microbatch: frozenset
    schedule: str                                      # "1f1b" | "gpipe"
    replicas: int = 1                                  # GPUs per stage (data parallel)
    tasks: list[Key] = field(default_factory=list)     # what this rank computes, in order
    recv: dict[Key, Transfer] = field(default_factory=dict)        # value -> how it arrives here
    send: dict[Key, list[Transfer]] = field(default_factory=dict)  # value -> where it goes
    pairs: dict[int, list[Transfer]] = field(default_factory=dict)  # peer -> transfers, agreed order
    _steps: list | None = field(default=None, repr=False, compare=False)

    def steps(self) -> list["Step"]:
        """The tasks with what the runtime does around each (made once): the receives to post
        before it, the sends after it, and the values it can free then. Every transfer of a pair
        is posted in the agreed order, so a post covers the pair's transfers up to the one named.
        A value is freed once this rank's tasks have read it and its sends are posted; outputs
        are kept. runtime/spmd.py runs this, passes/stage.py counts its memory."""
        if self._steps is None:
            self._steps = _steps(self)
        return self._steps

    def needs(self, nid: int, mb: int | None) -> list[Key]:
        """The values task (nid, mb) reads."""
        n = self.graph.node(nid)
        every = n.op in ALL_PARTS or mb is None
        out: list[Key] = []
        for i in n.inputs:
            if i not in self.per_microbatch:
                out.append((i, None))
            elif every:
                out.extend((i, m) for m in range(self.parts))
            else:
                out.append((i, mb))
        return out


# Combinations over microbatches that read every microbatch's piece of their input.
ALL_PARTS = (Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL)


@dataclass(frozen=True)
class Step:
    node: int
    mb: int | None
    reads: tuple                  # the values the task reads (ir keys), in argument order
    posts: tuple                  # (peer, upto): post the pair's transfers up to `upto` before the task
    sends: tuple                  # (peer, upto): ... after it (its value goes out)
    frees: tuple                  # values nothing here needs after the task
    into: int | None = None       # an addend: summed at once into the running sum of this node's value
    summed: int | None = None     # a sum over microbatches: reads the running sum of this node instead

    @property
    def key(self) -> Key:
        return (self.node, self.mb)


SUMS = (Op.ALL_REDUCE, Op.REDUCE_SCATTER)


def running_sums(plan: RankPlan) -> dict[int, int]:
    """Addend node -> the sum over microbatches (all_reduce / reduce_scatter) that alone reads it
    here: each microbatch's addend is added to a running sum as soon as it is made and freed (a
    weight gradient is accumulated, not kept M times and stacked). Only for addends made here,
    never sent, with at least two microbatches."""
    if plan.parts < 2:
        return {}
    readers: dict[int, set[int]] = {}
    made = {nid for nid, _ in plan.tasks}
    for nid, m in plan.tasks:
        for i, _m in plan.needs(nid, m):
            readers.setdefault(i, set()).add(nid)
    sent = {key[0] for key in plan.send}
    outputs = set(tree_ids(plan.graph.output))
    out = {}
    for nid in made:
        n = plan.graph.node(nid)
        i = n.inputs[0] if n.op in SUMS else None
        if i is not None and i in plan.per_microbatch and i in made and readers.get(i) == {nid} \
                and i not in sent and i not in outputs:
            out[i] = nid
    return out


def _steps(plan: RankPlan) -> list[Step]:
    keep = {(i, None) for i in tree_ids(plan.graph.output)}
    into = running_sums(plan)
    summed = {s: a for a, s in into.items()}
    remaining: dict[Key, int] = {}
    for nid, m in plan.tasks:
        for key in plan.needs(nid, m):
            if key[0] not in into:
                remaining[key] = remaining.get(key, 0) + 1
    cursor = {peer: 0 for peer in plan.pairs}
    alive: set[Key] = set()
    out = []

    def post(peer: int, upto: int, into: list) -> None:
        if cursor[peer] <= upto:
            into.append((peer, upto))
            cursor[peer] = upto + 1
    for nid, m in plan.tasks:
        here = (nid, m)
        reads = [key for key in plan.needs(nid, m) if key[0] not in into]
        posts: list = []
        for key in reads:
            if key in plan.recv and key not in alive:
                post(plan.recv[key].src, plan.recv[key].seq, posts)
                alive.add(key)
        alive.add(here)
        sends: list = []
        for t in plan.send.get(here, ()):
            post(t.dst, t.seq, sends)
        frees = []
        for key in [*reads, here]:
            if key in reads:
                remaining[key] -= 1
            if not remaining.get(key) and key not in keep and key in alive \
                    and all(cursor[t.dst] > t.seq for t in plan.send.get(key, ())):
                alive.discard(key)
                frees.append(key)
        out.append(Step(nid, m, tuple(reads), tuple(posts), tuple(sends), tuple(frees), into.get(nid),
                        summed.get(nid)))
    return out


def stage_plan(graph: Graph, stage: int) -> RankPlan:
    return stage_plans(graph)[stage]


_PLANS: dict[int, tuple[Graph, list[RankPlan]]] = {}     # least recently used first
_MAX_PLANS = 8
_PLANS_LOCK = threading.Lock()      # ranks may be threads of one process (one executor each)


def stage_plans(graph: Graph) -> list[RankPlan]:
    """Every stage's part, made once per graph object (the simulation costs milliseconds, which a
    run would otherwise pay before each step's first task; the plans are read, never changed)."""
    key = id(graph)
    with _PLANS_LOCK:
        hit = _PLANS.get(key)
    if hit is None or hit[0] is not graph:
        hit = (graph, _stage_plans(graph, len(stage_gpus(graph))))
    with _PLANS_LOCK:
        _PLANS.pop(key, None)
        _PLANS[key] = hit
        while len(_PLANS) > _MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
    return hit[1]


def _stage_plans(graph: Graph, world: int) -> list[RankPlan]:
    """Each rank runs its nodes, and the free ones it needs, in graph order; with microbatches,
    runs of per-microbatch nodes go microbatch by microbatch, and a run ends where a node waits for
    a value that comes back from another GPU after this one sent it (the backward pass) or reads
    every microbatch. A forward run and its backward run then go GPipe-style (all forwards, then
    all backwards) or 1F1B (below). A simulation of all ranks in step gives each transfer its
    time; every pair posts its transfers in that order, which each side reaches in its own order
    of work, so sends and receives pair up."""
    mb = microbatch_graph(graph, stage_replicas(graph))
    g, parts, per = mb.graph, mb.parts, mb.per_microbatch
    st = infer_stages(g)
    outputs = tree_ids(g.output)
    plans = [RankPlan(r, g, parts, per, mb.schedule, mb.replicas) for r in range(world)]
    # Which values cross GPUs (any microbatch of them), and to where.
    cross: dict[int, set[int]] = {}
    for n in g.nodes:
        here = st[n.id]
        if here is None:
            continue
        for i in n.inputs:
            if st[i] is not None and st[i] != here:
                cross.setdefault(i, set()).add(here)
    for i in outputs:
        if st[i] not in (None, 0):
            cross.setdefault(i, set()).add(0)
    # The stages each value depends on (a value received back after this GPU's own sends closes a
    # round trip: the forward/backward boundary).
    anc: dict[int, frozenset] = {}
    for n in g.nodes:
        a: set[int] = set()
        for i in n.inputs:
            a |= anc[i]
            if st[i] is not None:
                a.add(st[i])
        anc[n.id] = frozenset(a)
    first_at: dict[int, int] = {}                # each GPU's first node, by graph position
    deps_on: dict[int, set[int]] = {r: set() for r in range(world)}    # GPUs whose nodes depend on r
    for k, n in enumerate(g.nodes):
        if st[n.id] is not None:
            first_at.setdefault(st[n.id], k)
            for r in anc[n.id] - {st[n.id]}:
                deps_on[r].add(st[n.id])
    for r in range(world):
        first_at.setdefault(r, len(g.nodes))
    after_per: dict[int, bool] = {}              # depends on some per-microbatch value
    for n in g.nodes:
        after_per[n.id] = any(i in per or after_per[i] for i in n.inputs)
    for plan in plans:
        r = plan.rank
        need = _computed_on(g, st, r)
        run = [n.id for n in g.nodes if n.id in need]
        # Blocks: ("once", id) runs once; ("seg", ids, back) runs ids microbatch by microbatch (back:
        # it starts where a value comes back to this GPU, a backward pass).
        blocks: list[tuple] = []
        seg: list[int] = []
        seg_back = False

        def close() -> None:
            if seg:
                blocks.append(("seg", list(seg), seg_back))
                seg.clear()
        for nid in run:
            n = g.node(nid)
            if nid not in per and not after_per[nid]:
                blocks.append(("once", nid))         # needs no microbatch: runs ahead, no barrier
                continue
            if nid in per:
                back = any(st[i] is not None and st[i] != r and r in anc[i] for i in n.inputs)
                if n.op in ALL_PARTS or (back and seg):
                    close()
                if not seg:
                    seg_back = back
                seg.append(nid)
            else:
                close()
                blocks.append(("once", nid))
        close()
        # 1F1B: a forward run followed by its backward run interleave after a warm-up of one
        # forward microbatch per GPU downstream (those hold the others in flight), so this GPU keeps
        # at most that many microbatches' activations; GPipe runs all forwards, then all backwards.
        # Downstream: the GPUs whose work starts later in the program and depends on this one's
        # (the backward pass also depends on it, from earlier GPUs: those do not count).
        downstream = {s for s in deps_on[r] if first_at[s] > first_at[r]}
        warm = min(parts, len(downstream))
        k = 0
        while k < len(blocks):
            kind, *body = blocks[k]
            if kind == "once":
                plan.tasks.append((body[0], None))
                k += 1
                continue
            j = k + 1
            while j < len(blocks) and blocks[j][0] == "once" and not after_per[blocks[j][1]]:
                j += 1                               # values needing no microbatch can go first
            if mb.schedule == "1f1b" and j < len(blocks) and blocks[j][0] == "seg" and blocks[j][2]:
                plan.tasks.extend((blocks[x][1], None) for x in range(k + 1, j))
                fwd, bwd = body[0], blocks[j][1]
                steps = [(fwd, m) for m in range(warm)]
                for i in range(parts):
                    if warm + i < parts:
                        steps.append((fwd, warm + i))
                    steps.append((bwd, i))
                plan.tasks.extend((nid, m) for ids, m in steps for nid in ids)
                k = j + 1
                continue
            plan.tasks.extend((nid, m) for m in range(parts) for nid in body[0])
            k += 1
    # Simulate the ranks in step (one time unit per task) to time each transfer; each rank runs
    # the first task of its order that is ready (list scheduling), so the orders never deadlock.
    sent_at: dict[Key, int] = {}
    clock = [0] * world
    events: list[tuple[int, int, int, Key]] = []       # (time, src, graph position, key)
    pos = {n.id: k for k, n in enumerate(g.nodes)}
    pending = [list(p.tasks) for p in plans]
    done = [set() for _ in range(world)]
    order = [[] for _ in range(world)]
    relaxed = False
    while any(pending):
        moved = False
        for r in range(world):
            plan = plans[r]
            while pending[r]:
                pick = None
                for j, (nid, m) in enumerate(pending[r] if relaxed else pending[r][:1]):
                    ks = plan.needs(nid, m)
                    if all((k in sent_at) if (st[k[0]] is not None and st[k[0]] != r) else (k in done[r]) for k in ks):
                        pick = j
                        break
                if pick is None:
                    break
                relaxed = False
                nid, m = pending[r].pop(pick)
                remote = [k for k in plan.needs(nid, m) if st[k[0]] is not None and st[k[0]] != r]
                clock[r] = max([clock[r], *(sent_at[k] for k in remote)]) + 1
                done[r].add((nid, m))
                order[r].append((nid, m))
                if nid in cross:
                    sent_at[(nid, m)] = clock[r]
                    events.append((clock[r], r, pos[nid], (nid, m)))
                moved = True
        if not moved:
            if relaxed:
                raise RuntimeError("internal: the pipeline schedule cannot go on")
            relaxed = True
    for r in range(world):
        plans[r].tasks = order[r]
    by_pair: dict[tuple[int, int], list[Transfer]] = {}
    for _t, src, _p, (nid, m) in sorted(events, key=lambda e: (e[0], e[1], e[2], -1 if e[3][1] is None else e[3][1])):
        for dst in sorted(cross[nid]):
            pair = (min(src, dst), max(src, dst))
            seq = by_pair.setdefault(pair, [])
            seq.append(Transfer(nid, m, src, dst, len(seq)))
    for (lo, hi), seq in by_pair.items():
        for r, peer in ((lo, hi), (hi, lo)):
            plans[r].pairs[peer] = seq
            for t in seq:
                if t.dst == r:
                    plans[r].recv[t.key] = t
                else:
                    plans[r].send.setdefault(t.key, []).append(t)
    return plans


def stage_summary(graph: Graph) -> dict:
    """The placement as data (manifest, inspect, --emit ir-opt): each stage's GPUs and nodes,
    microbatches, what each pair of stages sends (per value: how many times, and bytes in all; each
    replica sends as much) and, with stages of several GPUs, the collectives inside each stage."""
    st = infer_stages(graph)
    gpus = stage_gpus(graph)
    world = len(gpus)
    nodes = [sum(1 for n in graph.nodes if st[n.id] == k and n.op not in (Op.STAGE, Op.MICROBATCH))
             for k in range(world)]
    free = sum(1 for n in graph.nodes if st[n.id] is None and n.op not in (Op.INPUT, Op.CONST))
    plans = stage_plans(graph)
    g = plans[0].graph
    known_ids = {n.id for n in graph.nodes}

    def shown(v: int) -> int:
        """The node of `graph` a value of the microbatched graph comes from (a combination over
        microbatches has a fresh id: name what it combines)."""
        while v not in known_ids and g.node(v).inputs:
            v = g.node(v).inputs[0]
        return v
    sends: dict[tuple[int, int, int], dict] = {}
    for plan in plans:
        for ts in plan.send.values():
            for t in ts:
                node = g.node(t.value)
                row = sends.setdefault((t.src, t.dst, t.value), {
                    "id": shown(t.value), "from": t.src, "to": t.dst, "times": 0, "bytes": 0,
                    "line": node.src[0] if node.src else None})
                size = nbytes(node)
                row["times"] += 1
                row["bytes"] = None if size is None or row["bytes"] is None else row["bytes"] + size
    rows = sorted(sends.values(), key=lambda s: (s["from"], s["to"], s["id"]))
    known = [s["bytes"] for s in rows if s["bytes"] is not None]
    replicas = plans[0].replicas
    collectives = []           # inside a stage of several GPUs: what combines the replicas' microbatches
    for plan in plans if replicas > 1 else ():
        seen: set[int] = set()
        for nid, _m in plan.tasks:
            node = g.node(nid)
            if node.op in ALL_PARTS and nid not in seen:
                seen.add(nid)
                size = nbytes(node)
                whole = None if size is None else size * (1 if node.op in (Op.ALL_REDUCE, Op.ALL_GATHER)
                                                          else plan.parts * replicas)
                collectives.append({"id": shown(nid), "stage": plan.rank, "op": node.op.value, "bytes": whole,
                                    "line": node.src[0] if node.src else None})
    known_c = [c["bytes"] for c in collectives if c["bytes"] is not None]
    return {"stages": world, "gpus": [list(x) for x in gpus], "replicas": replicas,
            "microbatches": plans[0].parts, "schedule": plans[0].schedule,
            "nodes": nodes, "free_nodes": free,
            "transfers": rows, "tasks": [len(p.tasks) for p in plans],
            "collectives": collectives, "collective_bytes": sum(known_c),
            "bytes_moved": sum(known), "bytes_unknown": len(known) != len(rows) or len(known_c) != len(collectives)}
