"""The element-wise kernel kind: one program per BLOCK elements of the flattened domain (source in
`triton_src.elementwise`), its launch (every operand broadcast to the domain; gathers and unindex
nodes read through their own strides), its config space and its cost model."""

from __future__ import annotations

import math

from xgbuild.hw import GpuProfile

from ....errors import ExecutionError
from ...ir.graph import Node
from ...ir.serialize import where as src_text
from ...ir.strides import contiguous_strides
from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Frame, Launch, Variant, align
from ..spec import Binding, KernelSpec
from ..triton_src import elementwise, unindex_params
from .base import Config, KernelTemplate, Problem, make_config, next_pow2, row_blocks_grid, row_tiles_programs
from .local import build, domain_level
from .roofline import BASE_REGS_PER_THREAD, SPILL_PENALTY, blocks_per_sm, scalar_peak, stream_s

BLOCKS = (256, 512, 1024, 2048, 4096, 8192)
WARPS = (2, 4, 8)
# A domain of 2+ dims whose last is at least this long is also offered in row blocks (`ROWBLOCK`,
# `triton_src.elementwise`): BLOCK elements of one row a program, no per-element division by the
# last dim, one address for a row-broadcast operand. GPT-2's logits' gradient ([8192, 50304],
# reading four per-row values) took 1.07 ms for 1.65 GB flattened on an H200.
ROWBLOCK_MIN = 512
# A shorter last dim, at least this long, is offered in row tiles (`ROWBLOCK` with `COLS`): BLOCK //
# COLS rows a program, COLS the smallest power of two covering the row. Flat blocks of a domain
# read through strides (an unindex, a transposed operand) divide the linear index by every dim
# per element and cannot prove any run of lanes contiguous; row tiles divide once a row and load
# and store the last dim in vectors. Attention's head gradients placed into [B, T, 3, H, DH]
# (75 MB a layer in bfloat16) moved at 1.2 TB/s flat on an H200.
ROWTILE_MIN = 16
ROWTILE_BLOCKS = (1024, 2048, 4096)
ROWTILE_WARPS = (4, 8)
# Elements per thread beyond this hold too many registers per input.
MAX_ELEMENTS_PER_THREAD = 64


def _block_vs_numel(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    # Keep one block size that covers the whole domain; larger ones only mask more lanes off.
    cover = max(BLOCKS[0], next_pow2(p.numel))
    if c["BLOCK"] > cover:
        return f"BLOCK {c['BLOCK']} > {cover}, the smallest block covering numel {p.numel}"
    return None


def _row_block(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    if c.get("COLS", 0):
        if not c.get("ROWBLOCK", 0):
            return "COLS needs ROWBLOCK"
        if c["COLS"] > c["BLOCK"] or c["BLOCK"] % c["COLS"] or c["COLS"] & (c["COLS"] - 1):
            return f"COLS {c['COLS']} must be a power of two dividing BLOCK {c['BLOCK']}"
        if p.cols < ROWTILE_MIN or c["COLS"] > next_pow2(p.cols):
            return f"row tiles of {c['COLS']} columns need a last dim of {ROWTILE_MIN} to {c['COLS']}, got {p.cols}"
        return None
    if c.get("ROWBLOCK", 0) and p.cols < ROWBLOCK_MIN:
        return f"ROWBLOCK needs a last dim of at least {ROWBLOCK_MIN}, got {p.cols}"
    if c.get("ROWBLOCK", 0) and c["BLOCK"] > next_pow2(p.cols):
        return f"a row block of {c['BLOCK']} > {next_pow2(p.cols)}, the most a row of {p.cols} needs"
    return None


def _per_thread(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    per_thread = c["BLOCK"] / (32 * c["num_warps"])
    if per_thread > MAX_ELEMENTS_PER_THREAD:
        return (f"BLOCK {c['BLOCK']} over {c['num_warps']} warps is {per_thread:g} elements per "
                f"thread > {MAX_ELEMENTS_PER_THREAD}")
    if per_thread < 1:
        return (f"BLOCK {c['BLOCK']} leaves {per_thread:g} elements per thread "
                f"of {c['num_warps']} warps")
    return None


def _unindex_ints(k: int, n, shape: tuple, tensors: dict, node: Node | None) -> dict[str, int]:
    """An `unindex` node's slice and index arguments; run-time indices read back to the host and
    bounds-checked as the CPU executor checks them (0 on meta tensors, where only layouts matter)."""
    items = dict(n.attrs)["items"]

    def index(pos: int) -> int:
        t = tensors[f"p{n.args[pos][1]}"]
        return 0 if t.device.type == "meta" else int(t.item())

    out = unindex_params(k, items, shape, index)
    for a, item in enumerate(items):
        if item[0] != "s":
            at, size = out[f"u{k}_{a}_at"], int(shape[a])
            if not -size <= at < size:
                where = f" at {src_text(node.src)}" if node is not None and node.src else ""
                raise ExecutionError(f"index {at} is out of bounds for dimension {a} of size {size}{where}")
            out[f"u{k}_{a}_at"] = at % size
    return out


class ElementwiseTemplate(KernelTemplate):
    kind = "elementwise"
    # Memory-bound: every candidate lands within a few percent of the copy-bandwidth floor, where
    # the model's ratios scatter (0.2x-2.7x on the H100 fixture), so none is pruned by its bound;
    # they compile in a fraction of a second each.
    bound_margin = 0.0
    params = ("BLOCK",)
    optional = ("ROWBLOCK", "COLS")
    sizes = ("numel",)
    rules = (_block_vs_numel, _per_thread, _row_block)

    def joins(self, k: Kernel, shape: tuple, inner: list[int], graph, users: dict) -> bool:
        return shape == tuple(k.shape)

    def prologue_of_reduction(self, k: Kernel, shape: tuple) -> bool:
        return tuple(k.shape) == shape

    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        spec, operands, written = build(sched, k, domain_level(len(k.shape)))
        return spec, Binding(tuple(operands), written, k.nodes[0], "shape")

    def emit(self, e: Emitter) -> Emitted:
        return elementwise(e)

    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        out = graph.node(b.outputs[0]) if b.outputs else None

        def sizes(tensors: dict) -> dict[str, int]:
            ints = {"numel": math.prod(domain)}
            if len(domain) >= 2 and domain[-1] >= ROWTILE_MIN:
                ints["L"] = int(domain[-1])           # the row blocks' (or tiles') row length
            for k, n in enumerate(spec.nodes):
                if n.op == "unindex":
                    ints.update(_unindex_ints(k, n, domain, tensors, out))
                elif n.op == "gather":
                    ints[f"g{k}_rows"] = int(tensors[f"p{n.args[0][1]}"].shape[0])
            return ints
        return Frame(domain, lambda _j, _level, t: align(t, domain), sizes, domain)

    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        if config.get("COLS", 0):
            return (row_tiles_programs(ints["numel"], ints["L"], config["BLOCK"], config["COLS"]), 1, 1)
        if config.get("ROWBLOCK", 0):
            return row_blocks_grid(ints["numel"], ints["L"], config["BLOCK"])
        return (-(-ints["numel"] // config["BLOCK"]), 1, 1)

    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        # Row blocks need a last dim long enough to have been given one (`frame`'s `L`); row tiles
        # and blocks compiled for longer rows than the launch's run it with more programs.
        if not config.get("ROWBLOCK", 0):
            return True
        return "L" in launch.ints and (config.get("COLS", 0) or launch.ints["L"] >= ROWBLOCK_MIN)

    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        read = [j for j, (_dt, level) in enumerate(spec.operands) if level != "scalar"]
        dims = [ints.get(f"d{d}") for d in range(spec.rank)]
        strided = any(n.op in ("unindex", "gather") for n in spec.nodes)
        if not strided and None not in dims and len(strides) == len(spec.operands):
            strided = any(tuple(strides[j]) != contiguous_strides(dims) for j in read)
        return Problem("elementwise", dtype, float(work * ints["numel"]), moved, numel=ints["numel"],
                       elem_bytes=widest, cols=ints.get("L", 0), live=len(read) + len(spec.outputs),
                       index_live=2 * (spec.rank - 1) if strided else 0)

    def shape_text(self, p: Problem) -> str:
        return f"{p.numel}x{p.cols}" if p.cols else f"{p.numel}"

    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        return False, False

    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        flat = [make_config(BLOCK=b, num_warps=w, num_stages=1) for b in BLOCKS for w in WARPS]
        if ROWTILE_MIN <= p.cols < ROWBLOCK_MIN:
            cols = next_pow2(p.cols)
            return flat + [make_config(BLOCK=b, num_warps=w, num_stages=1, ROWBLOCK=1, COLS=cols)
                           for b in ROWTILE_BLOCKS if b >= cols for w in ROWTILE_WARPS]
        if p.cols < ROWBLOCK_MIN:
            return flat
        return flat + [make_config(BLOCK=b, num_warps=w, num_stages=1, ROWBLOCK=1) for b in BLOCKS for w in WARPS]

    def default_config(self, p: Problem) -> Config:
        return make_config(BLOCK=1024, num_warps=4, num_stages=1)

    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        return scalar_peak(p.dtype, profile)

    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        threads = 32 * c["num_warps"]
        per_thread = c["BLOCK"] / threads
        # Each element of the block holds a register per operand and output while loads are in
        # flight, and in a flat block over strided operands its index along every dim (a row
        # block's or tile's indices are per row). Without this, 64 elements a thread looked free:
        # the predicted BLOCK 4096 over 2 warps ran attention's head placing (3 strided operands,
        # 5 dims) at 2.1 ms, and AdamW's update of the stacked weights (12 operands) at 3 ms.
        index = 0 if c.get("ROWBLOCK", 0) else p.index_live
        regs = BASE_REGS_PER_THREAD + per_thread * (1 + p.live + index)
        programs = math.ceil(p.numel / c["BLOCK"])
        if c.get("COLS", 0):            # each row's columns past the last dim masked
            programs = row_tiles_programs(p.numel, p.cols, c["BLOCK"], c["COLS"])
        elif c.get("ROWBLOCK", 0):        # each row's last block partly masked
            programs = (p.numel // p.cols) * math.ceil(p.cols / c["BLOCK"])
        per_sm = blocks_per_sm(hw, threads, regs)
        in_flight = min(c["BLOCK"], p.numel) * p.elem_bytes
        memory = stream_s(p.bytes, programs, per_sm, in_flight, hw, top.bandwidth)
        if regs > hw.max_registers_per_thread:      # the more it spills, the slower
            memory *= SPILL_PENALTY * regs / hw.max_registers_per_thread
        return max(memory, p.flops / top.flops)


TEMPLATE = ElementwiseTemplate()
