"""Launch replay for the GPU executors: one run's launches, recorded so that later runs with the
same input signature skip binding and variant checks (see `gpu.KernelExecutor` and
`native.NativeExecutor`: torch tensors or DeviceArrays, anything with a `data_ptr`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.ir.graph import Graph

MAX_REPLAYS = 8          # input signatures remembered per executor (oldest dropped first)


@dataclass
class Replay:
    """One run's launches, replayed while the inputs keep their shapes, strides, dtypes and 16-byte
    alignment: which variant holds, the grids and every integer argument depend on nothing else.
    Pointer arguments are named by source (an input, or a kernel's output), never kept."""
    graph: Graph
    steps: list[tuple]    # (Compiled variant, grid, recipe, output shapes/dtypes)


def recipe(args: list, sources: dict[int, tuple], nodes: list, value) -> list | None:
    """Each argument by source: ("in", name), ("out", kernel, i), ("int", value), or ("node", id)
    for a pointer that starts no input or output but is the start of that operand node's value (a
    view at an offset, a copy): the replay computes the view or copy again from its sources. None
    when a pointer is none of these. `nodes[i]` is argument i's operand node (None: not one)."""
    out = []
    for a, nid in zip(args, nodes):
        if hasattr(a, "data_ptr"):
            src = sources.get(a.data_ptr())
            if src is None or src[0] == "?":
                if nid is None or value(nid).data_ptr() != a.data_ptr():
                    return None
                src = ("node", nid)
            out.append(src)
        else:
            out.append(("int", a))
    return out


def record(steps: list | None, sources: dict[int, tuple], index: int, plan, chosen, grid: tuple, args: list,
           outs: list, shapes: list, value) -> list | None:
    """`steps` with plan `index`'s launch added (its outputs named as sources for later launches),
    or None once a launch cannot be recorded (or when `steps` is None: nothing is recorded)."""
    if steps is None:
        return None
    for i, t in enumerate(outs):
        sources[t.data_ptr()] = ("out", index, i) if t.data_ptr() not in sources else ("?",)
    operand = {f"p{j}": nid for j, nid in enumerate(plan.binding.operands)}
    rec = recipe(args, sources, [operand.get(name) for name, _ty in chosen.params], value)
    return None if rec is None else steps + [(chosen, grid, rec, shapes)]


def remember(replays: dict, key: tuple, graph: Graph, steps: list) -> None:
    """Keep a recorded run under its input signature (the oldest of MAX_REPLAYS dropped)."""
    if len(replays) >= MAX_REPLAYS:
        replays.pop(next(iter(replays)))
    replays[key] = Replay(graph, steps)


def replay_args(rec: list, inputs, produced: list, value, flags) -> list:
    """A recorded launch's arguments for this run: inputs by name, earlier launches' outputs,
    views computed again, the flag word, and the recorded integers."""
    return [inputs[r[1]] if r[0] == "in" else produced[r[1]][r[2]] if r[0] == "out"
            else value(r[1]) if r[0] == "node" else flags if r[0] == "flags" else r[1] for r in rec]
