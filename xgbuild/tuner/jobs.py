"""Tuning jobs: one per (kernel spec, tuning shape, operand layouts, GPU).

`plan` schedules a program's graph into kernels, places every kernel on meta tensors at the tuning
shape (the executor's own binding code, so build and run agree on layouts and sizes) and groups
identical kernels into one job: a program that uses the same kernel twice tunes it once.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import torch

from ..compiler.codegen.launch import bind
from ..compiler.codegen.launch_abi import Compiled, KernelPlan, Launch, Variant
from ..compiler.codegen.schedule import schedule
from ..compiler.codegen.spec import Binding, KernelSpec
from ..compiler.codegen.templates import kernel_specs, template
from ..compiler.codegen.templates.base import Problem
from ..compiler.ir.graph import COLLECTIVE, Graph, Node
from ..compiler.passes.specialize import specialize
from ..dtypes import TORCH_DTYPES
from ..runtime.values import Values

DEFAULT_DIM = 1024     # a symbolic dim the build was not told about is tuned at this size
MAGIC = re.compile(r"d\d+[ms]")    # a size's division magic (launch.div_magic), not a size of its own
OUT_STRIDE = re.compile(r"q\d+_s\d+")   # an output's run-time stride (hinted as a multiple of 16 where it is one)


@dataclass
class Job:
    spec: KernelSpec
    problem: Problem
    layouts: tuple                      # per operand at the tuning shape: "dense" or strides (0/1 kept)
    sizes: dict[str, int]               # the launch's integer arguments at the tuning shape
    graph: Graph                        # the program specialised to the tuning shape
    sites: list[tuple[Binding, list[int]]] = field(default_factory=list)   # (binding, kernel nodes)
    # An operand is a view at an offset that is not a multiple of 16 bytes at the tuning shape (a
    # convolution's shifted window): the tuned variant may not assume aligned pointers.
    misaligned: bool = False

    @property
    def ident(self) -> str:
        lay = hashlib.sha256(repr(self.layouts).encode()).hexdigest()[:8]
        return f"{self.spec.name}:{self.shape_text}:{lay}" + (":u" if self.misaligned else "")

    @property
    def shape_text(self) -> str:
        return template(self.problem.kind).shape_text(self.problem)

    def shape_part(self) -> dict:
        # Strides are in the layouts; division magic numbers follow from the sizes (launch.div_magic).
        sizes = {k: v for k, v in sorted(self.sizes.items()) if not k.startswith("p") and not MAGIC.fullmatch(k)}
        part = {"sizes": sizes,
                "layouts": [lay if lay == "dense" else list(lay) for lay in self.layouts]}
        if self.misaligned:
            part["misaligned"] = True
        return part

    def fast_variant(self, config: dict[str, int]) -> Variant:
        """What the tuned kernel may assume: this job's layouts, int32 offsets where they fit,
        sizes and strides hinted as multiples of 16 where the tuning shape has them (the others
        left out by name), a single row tile where it fits."""
        wide = any(v > 2**31 - 1 for v in self.sizes.values()) or self.max_extent > 2**31 - 1
        single, even_k = template(self.problem.kind).assumptions(self.problem, config)
        # Sizes and run-time strides compiled as multiples of 16 must be so at the tuning shape.
        hinted = ["N", "K", "C", "L", "DV", "numel", "SLOT"] + [f"p{j}_s{d}" for j, lay in enumerate(self.layouts)
                                              if lay != "dense" for d, s in enumerate(lay) if s is None] \
            + [name for name in self.sizes if OUT_STRIDE.fullmatch(name)]
        unaligned = tuple(name for name in hinted if name in self.sizes and self.sizes[name] % 16)
        return Variant(wide=wide, layouts=self.layouts, aligned=not self.misaligned, single=single,
                       even_k=even_k, unaligned=unaligned)

    max_extent: int = 0


def tuning_env(graph: Graph, dims: dict[str, int] | None) -> dict[str, int]:
    dims = dict(dims or {})
    return {s: dims.get(s, DEFAULT_DIM) for s in sorted(graph.symbols())}


def _layout_of(seen, strides: tuple, tiled: bool) -> object:
    """A variant's layout assumption from what the tuning shape shows: "dense", or per dim a baked
    stride of 0 or 1 (run-time otherwise). Operands read as 2-D tiles (matmul, attention: the
    template's `tiled`) always use strides."""
    form, _shape = seen
    if form == "dense" and not tiled:
        return "dense"
    return tuple(s if s in (0, 1) else None for s in strides)


def _meta(n: Node) -> torch.Tensor:
    return torch.empty(tuple(n.shape), dtype=TORCH_DTYPES[n.dtype], device="meta")


def _problem(spec: KernelSpec, launch: Launch, graph: Graph, outputs: list[int]) -> Problem:
    read = 0
    widest = 1
    for j, (dtype, level) in enumerate(spec.operands):
        t = launch.tensors[f"p{j}"]
        unique = math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)
        if level == "table":
            # A gather reads one table element per element of its domain, not the whole table.
            unique = min(unique, launch.ints["numel"])
        item = TORCH_DTYPES[dtype].itemsize
        read += unique * item
        widest = max(widest, item)
    written = sum(math.prod(graph.node(n).shape) * TORCH_DTYPES[graph.node(n).dtype].itemsize for n in outputs)
    work = sum(1 for n in spec.nodes if n.op != "matmul")
    dtype = spec.operands[0][0] if spec.operands else spec.nodes[spec.outputs[0]].dtype
    strides = tuple(tuple(launch.tensors[f"p{j}"].stride()) for j in range(len(spec.operands)))
    return template(spec.kind).problem(spec, launch.ints, dtype, work, float(read + written), widest, strides)


def plan(graph: Graph, env: dict[str, int], world: int = 1) -> tuple[list[Job], list[tuple[str, Binding]]]:
    """Jobs (deduplicated) and the program's launches in order: (job ident, binding), or
    ("extern", node id) for a PyTorch operator the engine calls eagerly."""
    sched = schedule(graph)
    pairs = iter(kernel_specs(sched))
    sg = specialize(graph, env)
    collective = None
    if world > 1 and any(n.op in COLLECTIVE for n in sg.nodes):
        # A sharded engine's kernels run on each rank's pieces: tune them at those shapes.
        from ..errors import InputError
        from ..runtime.spmd import local_graph
        try:
            sg = local_graph(sg, world)[0]

            def collective(n: Node, x: torch.Tensor) -> torch.Tensor:
                return torch.empty(tuple(n.shape), dtype=TORCH_DTYPES[n.dtype], device="meta")
        except InputError:
            pass                        # a tuning size the ranks do not divide: tune the whole shape
    value = Values(sg, _meta, meta=True, collective=collective)
    jobs: dict[str, Job] = {}
    launches: list[tuple[str, Binding | int]] = []
    generic = Compiled(Variant.generic(), {"BLOCK": 1}, [], [], None)
    for kernel in sched.kernels:
        if kernel.extern:
            launches.append(("extern", kernel.anchor))
            continue
        spec, binding = next(pairs)
        outs = [torch.empty(tuple(sg.node(n).shape), dtype=TORCH_DTYPES[sg.node(n).dtype], device="meta")
                for n in binding.outputs]
        launch = bind(KernelPlan(spec, binding, [generic]), sg, value, outs)
        layouts = tuple("dense" if spec.operands[j][1] == "scalar" else
                        _layout_of(seen, tuple(launch.tensors[f"p{j}"].stride()), template(spec.kind).tiled)
                        for j, seen in enumerate(launch.layouts))
        problem = _problem(spec, launch, sg, list(binding.outputs))
        extent = max([t.numel() for t in launch.tensors.values()] + [0])
        misaligned = any(t.storage_offset() * t.element_size() % 16 for t in launch.tensors.values())
        job = Job(spec, problem, layouts, dict(launch.ints), sg, max_extent=extent, misaligned=misaligned)
        job = jobs.setdefault(job.ident, job)
        # The reference recomputes what the kernel computes, index expressions included.
        job.sites.append((binding, list(kernel.inlined) + list(kernel.nodes)))
        launches.append((job.ident, binding))
    return list(jobs.values()), launches
