"""Binding a kernel to one run's tensors, choosing its compiled variant and its grid: the launch
ABI's functions, shared by the runtime's executors and the tuner (which binds on meta tensors at
the tuning shape, so build and run agree on layouts and sizes by construction).

For each kernel, `bind` lines every operand up with the kernel's domain (its template's `Frame`:
`expand`, then the kernel's dim order), reads the strides and the sizes of this run; `choose`
picks the first compiled variant whose assumptions (`launch_abi.Variant`) the launch meets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

from ...errors import ExecutionError
from ..ir.graph import Graph
from .launch_abi import GRID_YZ_MAX, INT32_MAX, Compiled, KernelPlan, Launch
from .spec import KernelSpec
from .templates import template


def bind(plan: KernelPlan, graph: Graph, value: Callable[[int], torch.Tensor],
         outputs: list[torch.Tensor], flags: torch.Tensor | None = None, checks: int = 0) -> Launch:
    """Operands lined up with the domain, and the sizes, for one launch of `plan`; `flags` (one
    int32 on the run's device) is check mode's NaN/Inf word, raised by the outputs whose bits
    `checks` sets (none by default: then a fresh word no kernel writes)."""
    spec, b = plan.spec, plan.binding
    node = graph.node(b.domain)
    domain = tuple(graph.node(node.inputs[0]).shape) if b.domain_from == "input0" else tuple(node.shape)
    frame = template(spec.kind).frame(spec, b, graph, domain)
    kdom = frame.kdom
    tensors: dict[str, torch.Tensor] = {}
    ints: dict[str, int] = {}
    layouts: list = []

    for j, (nid, (_dtype, level)) in enumerate(zip(b.operands, spec.operands)):
        t = value(nid)
        if level == "scalar":
            aligned = t.reshape(())
        elif level in ("gather", "table"):
            aligned = t                         # an unindex input or a gather's table, in its own shape
        elif level == "lead":
            # A gather's indices line up with the domain's leading dims, the same along the rest.
            aligned = t[(...,) + (None,) * (len(kdom) - t.dim())].expand(kdom)
        else:
            aligned = frame.align(j, level, t)
        tensors[f"p{j}"] = aligned
        if level == "scalar":
            layouts.append(("dense", ()))
            continue
        dense = aligned.is_contiguous() and level not in ("gather", "table")
        layouts.append(("dense" if dense else tuple(aligned.stride()), tuple(aligned.shape)))
        for d, s in enumerate(aligned.stride()):
            ints[f"p{j}_s{d}"] = int(s)
    for i, out in enumerate(outputs):
        tensors[f"q{i}"] = out
        if frame.out_perm is not None and out.dim() == len(domain) and len(domain):
            for d, s in enumerate(out.permute(frame.out_perm).stride()):   # full-level outputs in kernel order
                ints[f"q{i}_s{d}"] = int(s)
            if spec.lane_out and ints[f"q{i}_s{spec.row_dims - 1}"] != 1 and out.shape[frame.out_perm[spec.row_dims - 1]] > 1:
                raise ExecutionError(f"internal: {spec.name}'s output {i} has strides {tuple(out.stride())}; "
                                   "its kernel stores it with unit stride along the last kept dim")
        seen = frame.out_view(i, out) if frame.out_view is not None else None
        if seen is not None:
            for d, s in enumerate(seen.stride()):
                ints[f"q{i}_s{d}"] = int(s)
    ints.update(frame.sizes(tensors))
    for d, size in enumerate(frame.unravel):    # the sizes kernels unravel, and their division magic
        ints[f"d{d}"] = int(size)
        ints[f"d{d}m"], ints[f"d{d}s"] = div_magic(int(size))
    if flags is None:
        import torch
        device = outputs[0].device if outputs else (tensors["p0"].device if "p0" in tensors else "meta")
        flags = torch.zeros(1, dtype=torch.int32, device=device)
    tensors["flags"] = flags
    ints["checks"] = checks
    return Launch(tensors, ints, layouts)


def div_magic(d: int) -> tuple[int, int]:
    """(m, s) with x // d == (umulhi(x, m) + x) >> s for every 0 <= x < 2**31 in 32-bit unsigned
    arithmetic (Granlund and Montgomery's round-up method: s = ceil(log2(d)) and
    m = 2**32 * (2**s - d) // d + 1 < 2**32). m is passed as the int32 of the same bits, so every
    launch int stays in int32 (the kernel reads it back as uint32). d <= 0 (an empty dim, which no
    program divides by) gives (0, 0)."""
    if d <= 0:
        return 0, 0
    s = (d - 1).bit_length()
    m = (1 << 32) * ((1 << s) - d) // d + 1
    return (m - (1 << 32) if m >= 1 << 31 else m), s


def holds(c: Compiled, launch: Launch, spec: KernelSpec) -> bool:
    """Do this launch's arguments satisfy variant `c`'s assumptions?"""
    v = c.variant
    if not v.wide:
        for t in launch.tensors.values():
            extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()) if size > 0)
            if t.numel() > INT32_MAX or extent > INT32_MAX:
                return False
        if any(x > INT32_MAX or x < -INT32_MAX - 1 for x in launch.ints.values()):
            return False
    for j, lay in enumerate(v.layouts):
        seen, shape = launch.layouts[j]
        if lay == "dense":
            if seen != "dense":
                return False
        else:
            strides = launch.tensors[f"p{j}"].stride() if spec.operands[j][1] != "scalar" else ()
            for d, want in enumerate(lay):
                if want is not None and shape[d] > 1 and strides[d] != want:
                    return False
    if v.aligned:
        if any(t.data_ptr() % 16 for t in launch.tensors.values() if t.device.type != "meta"):
            return False
        if any(launch.ints[name] % 16 for name in c.div16):
            return False
    return template(spec.kind).accepts(v, c.config, launch)


def choose(plan: KernelPlan, launch: Launch) -> Compiled:
    """The first of `plan`'s variants (fastest first) whose assumptions the launch meets."""
    for c in plan.variants:
        if holds(c, launch, plan.spec):
            return c
    raise ExecutionError(f"internal: no variant of kernel {plan.spec.name} accepts this launch")


def grid_for(c: Compiled, spec: KernelSpec, launch: Launch) -> tuple[int, int, int]:
    """The launch grid of variant `c`; an ExecutionError past CUDA's limit on its y extent."""
    grid = template(spec.kind).grid(c.config, launch.ints)
    if grid[1] > GRID_YZ_MAX:
        raise ExecutionError(f"kernel {spec.name} would launch {grid[1]} batch programs along the grid's y "
                             f"dimension, over CUDA's limit of {GRID_YZ_MAX}: run the batch in smaller pieces")
    return grid


def block_rows(plan: KernelPlan, graph: Graph) -> int:
    """The rows `plan`'s kernel can run in blocks of (`rows_of`), or 0 where it cannot."""
    return template(plan.spec.kind).block_rows(plan.spec, plan.binding, graph)


def rows_of(launch: Launch, spec: KernelSpec, r0: int, r1: int) -> Launch:
    """A launch restricted to output rows r0..r1 (a kernel whose `block_rows` is not 0)."""
    return template(spec.kind).rows_of(spec, launch, r0, r1)

