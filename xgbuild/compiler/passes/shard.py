"""The sharding pass: an SPMD plan for `NUM_GPU` ranks, with the collectives it needs.

Needs: an inlined main graph in which a `SHARD(x, dim=d)` node says "from here on, x is split
along d" (from `with shard(x, dim=d)` blocks and from a `--sharding` plan file, both placed by
lowering; `dim=None`: "whole from here on"); inputs are replicated unless a SHARD splits them.

Leaves: every value has one layout (ir/layout.py: replicated, sharded along a dim, or partial sum)
and every node's input layouts match one of its local rules, so each rank runs the node on its own
pieces. Where a consumer needs another layout the pass inserts exactly one conversion op per
(value, layout): SHARD (a local slice, no traffic), ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER or
ALL_TO_ALL. A contraction over a sharded dim gives partial sums; outputs are replicated or
sharded (never partial: those are all-reduced). `infer_layouts` reads the plan back from the
graph alone. With `NUM_GPU = 1` there is nothing to plan: SHARD nodes are dropped. The greedy
planner itself is ir/planner.py (the microbatch plan uses it too); this pass picks the cheapest of
its plans.

It also checks that each GPU's share fits the target's HBM (XG0504).
"""

from __future__ import annotations

from dataclasses import replace

from ...hw import GpuProfile, load_profile
from ..frontend.codes import SHARD_MEMORY
from ..ir.graph import Graph, Node, Op, Program, tree_ids, tree_map
from ..ir.layout import R, S, collective_bytes, infer_layouts, local_shape, nbytes, split_inputs
from ..ir.planner import Planner, ShardingError
from ..ir.stages import has_stages, stage_gpus, stage_summary
from .stage import stage_footprint


def shard(program: Program) -> Program:
    n = program.num_gpu
    graph = _drop_shards(program.main) if n == 1 else best_plan(program.main, n)
    if program.target:
        check_footprint(graph, n, _profile(program))
    return replace(program, main=graph)


def _profile(program: Program) -> GpuProfile:
    """The profile the Program carries (loaded by the driver or importer from the settings' hw
    directory); a Program built by hand without one gets the built-in profile of its target."""
    return program.profile if program.profile is not None else load_profile(program.target)


def _drop_shards(g: Graph) -> Graph:
    alias: dict[int, int] = {}
    nodes = []
    for node in g.nodes:
        ins = tuple(alias.get(i, i) for i in node.inputs)
        if node.op is Op.SHARD:
            alias[node.id] = ins[0]
            continue
        nodes.append(replace(node, inputs=ins))
    return g.with_nodes(nodes, tree_map(g.output, lambda i: alias.get(i, i)))


def best_plan(g: Graph, n: int) -> Graph:
    """The planner is greedy: each node takes the layout cheapest for it, blind to its consumers.
    So it plans three ways and keeps the plan that moves the fewest bytes (then makes the fewest
    collectives; then the first): partial sums kept through every rule that keeps them (the plain
    greedy plan), and, counting a conversion that exists already or an output's all-reduce (made
    anyway) as free, partial sums left where that is strictly cheaper for outputs only, or for
    any node. Each may win: leaving them can spare a reduction (`C + D` of two outputs) or make
    later partial sums pay to meet the whole value."""
    plans = [Planner(g, n, free=free, leave=leave).run() for free, leave in
             ((False, "never"), (True, "outputs"), (True, "anywhere"))]
    return min(plans, key=lambda plan: _traffic(plan, n))


def _traffic(g: Graph, n: int) -> tuple[int, int]:
    """(bytes each GPU sends, collectives) of a plan; symbolic sizes guessed as the planner does."""
    moved = [collective_bytes(node, n, guess=True) or 0 for node in g.nodes
             if node.op in (Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL)]
    return sum(moved), len(moved)


# --- the per-GPU memory check -------------------------------------------------------------------
def footprint(graph: Graph, n: int) -> dict:
    """Bytes one GPU holds: its pieces of the inputs, and the peak of intermediates alive at once
    (in program order, each freed after its last use). Symbolic sizes are left out (unknown).
    A pipeline: the fullest stage's (each GPU of a stage holds as much), with every stage's in
    `per_stage`."""
    if n > 1 and has_stages(graph):
        per = stage_footprint(graph)
        worst = max(range(len(per)), key=lambda k: per[k]["total"])
        return {**per[worst], "stage": worst, "per_stage": per}
    layouts = infer_layouts(graph, n)
    outputs = set(tree_ids(graph.output))
    last: dict[int, int] = {}
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            last[i] = k

    by_name = split_inputs(graph)        # once: per input it made 25,000 externals take minutes
    split = {i: by_name[name] for name, i in graph.inputs if name in by_name}

    def local(node: Node) -> int:
        if node.op is Op.SHARD and node.inputs[0] in split:
            return 0                  # the input itself, loaded as this GPU's slice
        lay = S(split[node.id]) if node.id in split else layouts[node.id]
        return nbytes(replace(node, shape=local_shape(node.shape, lay, n))) or 0

    inputs = sum(local(graph.node(i)) for _, i in graph.inputs)
    live = peak = 0
    for k, node in enumerate(graph.nodes):
        if node.op is not Op.INPUT:
            live += local(node)
            peak = max(peak, live)
        for i in set(node.inputs):
            if last.get(i) == k and i not in outputs and graph.node(i).op is not Op.INPUT:
                live -= local(graph.node(i))
    return {"inputs": inputs, "activations": peak, "total": inputs + peak}


def check_footprint(graph: Graph, n: int, profile: GpuProfile) -> dict:
    fp = footprint(graph, n)
    stage = fp.get("stage")
    if fp["total"] > profile.hbm_bytes:
        big = max(graph.inputs, key=lambda kv: nbytes(graph.node(kv[1])) or 0, default=None)
        hint = (f"the largest input is `{big[0]}` ({_gb(nbytes(graph.node(big[1])) or 0)}); shard it "
                f"(`with shard({big[0]}, dim=0)` or a --sharding plan) or raise NUM_GPU") if big else "raise NUM_GPU"
        gpus = stage_gpus(graph) if stage is not None else ()
        who = ("the one GPU" if n == 1 else f"each GPU of pipeline stage {stage} (GPUs {list(gpus[stage])})"
               if stage is not None and len(gpus[stage]) > 1 else f"GPU {gpus[stage][0]} (pipeline stage {stage})"
               if stage is not None else f"each of the {n} GPUs")
        detail = (f"{who} needs {_gb(fp['total'])} (inputs {_gb(fp['inputs'])}, "
                  f"intermediates at the peak {_gb(fp['activations'])}), more than the {profile.name}'s "
                  f"{_gb(profile.hbm_bytes)} of HBM")
        src = graph.node(big[1]).src if big else None
        raise ShardingError(SHARD_MEMORY.code, SHARD_MEMORY.message.format(detail=detail), src, hint)
    return fp


def _gb(b: int) -> str:
    return f"{b / 1e9:.1f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def plan_of(graph: Graph, n: int, profile: GpuProfile | None = None) -> dict:
    """The plan as data (manifest, inspect, --emit ir-opt): layouts and collectives with bytes;
    with the target's profile, the time those bytes take at its interconnect's one-way bandwidth."""
    layouts = infer_layouts(graph, n)
    names = {i: name for name, i in graph.inputs}
    collectives = []
    for node in graph.nodes:
        if node.op in (Op.SHARD, Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL):
            collectives.append({"id": node.id, "op": node.op.value, "dim": node.attr("dim"),
                                "from": str(layouts[node.inputs[0]]), "to": str(layouts[node.id]),
                                "bytes": collective_bytes(node, n),
                                "line": node.src[0] if node.src else None})
    known = [c["bytes"] for c in collectives if c["bytes"] is not None]
    link = {}
    if profile is not None:
        ic = profile.interconnect
        # The datasheet figure counts both directions; a ring step sends one way.
        link = {"interconnect": ic.kind, "predicted_comm_ms": sum(known) / (ic.bandwidth_bytes_per_s / 2) * 1e3}
    stages = {"pipeline": stage_summary(graph)} if n > 1 and has_stages(graph) else {}
    if stages and profile is not None:
        ic = profile.interconnect
        pp = stages["pipeline"]
        # A ring all-reduce sends about 2 (D-1)/D of the value per GPU, a ring all-gather (D-1)/D.
        d = pp["replicas"]
        inside = sum((2 if c["op"] in ("all_reduce", "reduce_scatter") else 1) * (d - 1) / d * c["bytes"]
                     for c in pp["collectives"] if c["bytes"] is not None)
        link["predicted_comm_ms"] += (pp["bytes_moved"] + inside) / (ic.bandwidth_bytes_per_s / 2) * 1e3
    return {**link, **stages,
        "num_gpu": n,
        "inputs": {names[i]: str(layouts[i]) for _, i in graph.inputs},
        "outputs": [str(layouts[i]) for i in tree_ids(graph.output)],
        "values": {str(k): str(v) for k, v in layouts.items() if v != R},
        "collectives": collectives,
        "bytes_moved": sum(known),
        "bytes_unknown": len(known) != len(collectives),     # symbolic sizes: counted at run time
    }


def plan_lines(plan: dict) -> list[str]:
    """The plan for people: inputs and outputs, then each collective with the bytes it moves."""
    n = plan["num_gpu"]
    moving = sum(1 for c in plan["collectives"] if c["op"] != "shard")
    if "pipeline" in plan and not plan["collectives"]:
        pp = plan["pipeline"]
        mb, d = pp.get("microbatches", 1), pp.get("replicas", 1)
        how = {"1f1b": "after a warm-up, each GPU alternates one forward and one backward microbatch (1F1B)",
               "gpipe": "each GPU runs every forward microbatch, then the backward ones (GPipe)"}
        stages = (f"one stage each" if d == 1 else f"{pp['stages']} stages of {d} GPUs, "
                  + ", ".join(str(g) for g in pp.get("gpus", ())) + f": {d} data-parallel replicas of the pipeline")
        lines = [f"pipeline plan over {n} GPUs ({stages})" + (
            f", {mb} microbatches{' per replica' if d > 1 else ''}: {how.get(pp.get('schedule'), '')}" if mb > 1
            else ", no microbatches: the stages run in turn")]
    else:
        lines = [f"sharding plan over {n} GPU{'s' if n > 1 else ''}: {moving} collective{'s' if moving != 1 else ''} "
                 f"and {len(plan['collectives']) - moving} local slices, "
                 f"{_bytes(plan['bytes_moved'])} sent per GPU" + (" + symbolic sizes" if plan["bytes_unknown"] else "")]
    whole = [name for name, lay in plan["inputs"].items() if lay == "R"]
    layouts = "pipeline" not in plan      # a pipeline splits nothing: every value is whole (R)
    if "predicted_comm_ms" in plan:
        ms = plan["predicted_comm_ms"]
        took = f"{ms:.2f} ms" if ms >= 0.1 else f"{ms * 1e3:.3g} us"
        lines.append(f"  over {plan['interconnect']}: about {took} of transfers per step "
                     "(bandwidth alone; latency and overlap not counted)")
    for name, lay in plan["inputs"].items():
        if lay != "R":
            lines.append(f"  input  {name:<14} {lay}")
    if whole and layouts:
        lines.append(f"  inputs loaded whole (R): {', '.join(whole[:8])}" + (f" and {len(whole) - 8} more" if len(whole) > 8 else ""))
    for k, lay in enumerate(plan["outputs"] if layouts else []):
        lines.append(f"  output {k:<14} {lay}" + ("  (gathered to rank 0)" if lay.startswith("S") else ""))
    if "pipeline" in plan:
        pp = plan["pipeline"]
        d = pp.get("replicas", 1)
        sends = sum(t.get("times", 1) for t in pp["transfers"])
        unit, who = ("GPU", "GPU") if d == 1 else ("stage", f"GPU of a stage")
        lines.append(f"  nodes per {unit} {pp['nodes']} (+{pp['free_nodes']} computed on each {who} that uses them); "
                     f"{sends} point-to-point sends, {_bytes(pp['bytes_moved'])} in all"
                     + (f" per replica" if d > 1 else "") + (" + symbolic sizes" if pp["bytes_unknown"] else "")
                     + f"; outputs end on {unit} 0")
        for t in pp["transfers"]:
            moved = "? bytes (symbolic)" if t["bytes"] is None else _bytes(t["bytes"])
            times = f" ({t['times']} microbatches)" if t.get("times", 1) > 1 else ""
            where = f"  line {t['line']}" if t["line"] else ""
            lines.append(f"  %{t['id']:<5} send {unit} {t['from']} -> {unit} {t['to']}  {moved}{times}{where}")
        for c in pp.get("collectives", ()):
            moved = "? bytes (symbolic)" if c["bytes"] is None else _bytes(c["bytes"])
            where = f"  line {c['line']}" if c["line"] else ""
            lines.append(f"  %{c['id']:<5} {c['op']:<15} over the {d} GPUs of stage {c['stage']}  {moved}{where}")
    for c in plan["collectives"]:
        moved = "? bytes (symbolic)" if c["bytes"] is None else _bytes(c["bytes"])
        where = f"  line {c['line']}" if c["line"] else ""
        lines.append(f"  %{c['id']:<5} {c['op']:<15} {c['from']:>6} -> {c['to']:<6} {moved}{where}")
    return lines


def _bytes(b: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b} B"
