"""What an importer hands on: a Graph IR program, its weights, and how its inputs are called.

`ImportedProgram` is to PyTorch and ONNX models what `driver.Compiled` is to `.xg` sources: the
optimised graph the tuner links kernels for and the engine packages. Weights are INPUT nodes of
the graph whose values travel inside the engine (`weights.safetensors`); `inputs` are the rest,
in call order. `UnsupportedOps` is the one error that lists every op an importer cannot express;
`internal_error` is how an XG bug met while importing reaches the user: one line, no traceback.
"""

from __future__ import annotations

import re
import tempfile
import traceback
from dataclasses import dataclass, field, replace

import torch

from ...errors import CompileError
from ...hw import GpuProfile
from ..frontend.codes import INTERNAL, UNSUPPORTED_OPS
from ..frontend.diagnostics import plain_error
from ..ir.graph import Graph, Program, renumber, tree_ids
from ..passes import PASS_NAMES, run_pipeline


@dataclass(frozen=True)
class ImportedProgram:
    name: str                               # "GPT.aten.py" / "model.onnx.txt": the engine's source entry
    source: str                             # a text form of what was imported (ATen graph code, ONNX text)
    lowered: Program
    optimized: Program
    weights: dict[str, torch.Tensor]        # INPUT name -> value, bound by the engine
    inputs: tuple[str, ...]                 # the caller's inputs, in call order
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)   # integer inputs used as indices
    example_dims: dict[str, int] = field(default_factory=dict)         # symbol -> size seen at capture
    target: str = "H100"
    num_gpu: int = 1
    passes: tuple[str, ...] = field(default=tuple(PASS_NAMES))
    out_spec: object = None                 # the model's output structure (a torch pytree spec), in memory only
    # How the model is called, in memory only: the names positional arguments fill, in order
    # (forward's parameters), and the non-tensor arguments the capture fixed, with their values.
    params: tuple[str, ...] = ()
    fixed: dict[str, object] = field(default_factory=dict)


def finish(graph: Graph, *, name: str, source: str, weights: dict[str, torch.Tensor], inputs: list[str],
           ranges: dict[str, tuple[int, int]], example_dims: dict[str, int], target: str, num_gpu: int,
           verify_each: bool = False, out_spec: object = None, profile: GpuProfile | None = None,
           params: tuple[str, ...] = (), fixed: dict[str, object] | None = None) -> ImportedProgram:
    """Run the pass pipeline on an imported graph (the same passes as `.xg` programs). `profile`:
    the target's, as the caller loaded it from the settings' hw directory, carried by the Program."""
    lowered = Program(graph, profile=profile)
    # The engine keeps the source under this name: archive entry names are [A-Za-z0-9._-] only.
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "model"
    optimized = run_pipeline(lowered, verify_each=verify_each)
    optimized = replace(optimized, main=_drop_unused_weights(optimized.main, set(weights)))
    kept = {n for n, _ in optimized.main.inputs}
    return ImportedProgram(name, source, lowered, optimized, {k: v for k, v in weights.items() if k in kept},
                           tuple(inputs), {k: v for k, v in ranges.items() if k in kept}, example_dims,
                           target, num_gpu, out_spec=out_spec, params=tuple(params), fixed=dict(fixed or {}))


def _drop_unused_weights(graph: Graph, weights: set[str]) -> Graph:
    """Weights no op reads (a BatchNorm's `num_batches_tracked`, unused parameters) stay out of the
    engine; the caller's inputs stay in the signature even when unused, as for `.xg` programs."""
    read = {i for n in graph.nodes for i in n.inputs} | set(tree_ids(graph.output))
    dead = {nid for name, nid in graph.inputs if name in weights and nid not in read}
    if not dead:
        return graph
    return renumber(graph.with_nodes([n for n in graph.nodes if n.id not in dead],
                                     inputs=tuple((name, nid) for name, nid in graph.inputs if nid not in dead)))


@dataclass(frozen=True)
class Unsupported:
    """One use of an op XG could not translate."""
    op: str                                 # "aten.foo" / ONNX op type
    where: str                              # module path or ONNX node name
    why: str = ""
    graph: str = ""                         # "" the graph as captured; "decomposed": the retry's graph


@dataclass(frozen=True)
class UnsupportedOp:
    """An op XG could not translate, with every use of it: the report's unit."""
    op: str
    count: int                              # uses in the graph that holds the most of them
    where: tuple[str, ...]                  # every module path using it, first use first
    why: tuple[str, ...] = ()               # each distinct reason given, in order
    decomposed_only: bool = False           # met only in the graph `run_decompositions()` gives

    def note(self) -> str:
        marks = ([f"{self.count} uses"] if self.count > 1 else []) + \
            (["after decomposition"] if self.decomposed_only else [])
        marks_text = f" ({', '.join(marks)})" if marks else ""
        why = f": {'; '.join(self.why)}" if self.why else ""
        return f"{self.op}{marks_text} at {', '.join(self.where)}{why}"


def group_unsupported(items: list[Unsupported]) -> list[UnsupportedOp]:
    """Each op once, in order of first use. An importer may try several graphs of one model (the
    captured one, then the decomposed one) which hold the same uses twice: an op's count is its
    uses in the graph that has the most, not their sum."""
    order: dict[str, None] = {}
    counts: dict[tuple[str, str], int] = {}
    where: dict[str, dict[str, None]] = {}
    why: dict[str, dict[str, None]] = {}
    graphs: dict[str, set[str]] = {}
    for u in items:
        order.setdefault(u.op, None)
        counts[(u.op, u.graph)] = counts.get((u.op, u.graph), 0) + 1
        where.setdefault(u.op, {}).setdefault(u.where, None)
        if u.why:
            why.setdefault(u.op, {}).setdefault(u.why, None)
        graphs.setdefault(u.op, set()).add(u.graph)
    return [UnsupportedOp(op, max(c for (o, _), c in counts.items() if o == op), tuple(where[op]),
                          tuple(why.get(op, ())), graphs[op] == {"decomposed"})
            for op in order]


class UnsupportedOps(CompileError):
    """Every op of a model that XG cannot import, each once with its count and the modules (or
    ONNX nodes) that use it. `items` keeps every use as reported; `ops` the grouped form."""

    def __init__(self, what: str, items: list[Unsupported]) -> None:
        ops = group_unsupported(items)
        err = plain_error(UNSUPPORTED_OPS, what=what, count=len(ops), s="s" if len(ops) != 1 else "",
                          notes=tuple(u.note() for u in ops), help="supported ops are listed in docs/importers.md")
        super().__init__(str(err), err.diagnostics)
        self.items = items
        self.ops = ops


def internal_error(what: str, exc: BaseException) -> CompileError:
    """An exception raised by XG's own code (not by the model or the caller) as a one-line XG0900
    error naming it, its traceback written to a file for the bug report, so no traceback reaches
    the user."""
    with tempfile.NamedTemporaryFile("w", prefix="xg-ice-", suffix=".txt", delete=False) as f:
        f.write(f"internal compiler error while {what}\n\n")
        f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return plain_error(INTERNAL, detail=f"XG failed while {what} ({type(exc).__name__}: {first}); "
                                        f"traceback written to {f.name}",
                       help="this is a bug in XG, not in the model: please report it with that file")
