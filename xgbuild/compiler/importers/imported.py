"""What an importer hands on: a Graph IR program, its weights, and how its inputs are called.

`ImportedProgram` is to PyTorch and ONNX models what `driver.Compiled` is to `.xg` sources: the
optimised graph the tuner links kernels for and the engine packages. Weights are INPUT nodes of
the graph whose values travel inside the engine (`weights.safetensors`); `inputs` are the rest,
in call order. `UnsupportedOps` is the one error that lists every op an importer cannot express.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import torch

from ...errors import CompileError
from ...hw import GpuProfile
from ..frontend.codes import UNSUPPORTED_OPS
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


def finish(graph: Graph, *, name: str, source: str, weights: dict[str, torch.Tensor], inputs: list[str],
           ranges: dict[str, tuple[int, int]], example_dims: dict[str, int], target: str, num_gpu: int,
           verify_each: bool = False, out_spec: object = None, profile: GpuProfile | None = None) -> ImportedProgram:
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
                           target, num_gpu, out_spec=out_spec)


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
    op: str                                 # "aten.foo.default" / ONNX op type
    where: str                              # module path or ONNX node name
    why: str = ""


class UnsupportedOps(CompileError):
    """Every op of a model that XG cannot import, each with where the model uses it."""

    def __init__(self, what: str, items: list[Unsupported]) -> None:
        err = plain_error(UNSUPPORTED_OPS, what=what, count=len(items), s="s" if len(items) != 1 else "",
                          notes=tuple(f"{u.op} at {u.where}" + (f": {u.why}" if u.why else "") for u in items),
                          help="supported ops are listed in docs/importers.md")
        super().__init__(str(err), err.diagnostics)
        self.items = items
