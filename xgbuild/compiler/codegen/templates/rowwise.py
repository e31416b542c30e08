"""The row-reduction kernel kind: one program per row of the (permuted) domain, a row held whole
(`SINGLE`) or walked in BLOCK_N chunks (source in `triton_src.rowwise`), or `ROWS` adjacent rows a
program in [BLOCK_N, ROWS] tiles (`triton_src.rowwise_columns`: a reduction along a strided dim
whose rows are adjacent in memory, as a bias's gradient `sum(g, dim=0)`, or rows of at most
SHORT_COLS, as attention's per-head `sum(dO * O, dim=-1)`); its launch (kept dims,
then reduced ones; row values line up with the kept dims), its config space and its cost model."""

from __future__ import annotations

import math

from xgbuild.hw import GpuProfile

from ...ir.graph import Node, Op
from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Frame, Launch, Variant, align
from ..spec import Binding, KernelSpec
from ..triton_src import columns_fit, row_passes, rowwise, rowwise_columns
from .base import Config, KernelTemplate, Problem, make_config, next_pow2, row_blocks_grid
from .local import build
from .roofline import (BASE_REGS_PER_THREAD, L1_SPEEDUP, L2_SPEEDUP, MEMORY_LATENCY_S, SPILL_PENALTY,
                       blocks_per_sm, scalar_peak, stream_s)

SINGLE_WARPS = (1, 2, 4, 8, 16)
LOOP_BLOCKS = (256, 512, 1024, 2048, 4096)
LOOP_WARPS = (2, 4, 8)
SINGLE_MAX_COLS = 32768
COLUMN_ROWS = (32, 64, 128, 256)
COLUMN_BLOCKS = (8, 16, 32, 64)
COLUMN_WARPS = (2, 4, 8)
# A column tile's elements per thread: at least 4 (a 16-byte load of float32), at most 32 (the
# accumulator and the tile being loaded stay in registers).
COLUMN_PER_THREAD = (4, 32)
# Rows this short (attention's per-head rows of 64) are taken ROWS to a program in the column form
# too: one row a program leaves most of a warp idle (98304 rows of 64: 61 us on an H200 for 25 MB).
SHORT_COLS = 128
# A strided walk down one column loads one element of each 32-byte sector it touches.
SECTOR_BYTES = 32


def _columns(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    rows = c.get("ROWS", 0)
    if rows and not (p.columns or p.short_rows):
        return "ROWS needs a reduction along a strided dim with adjacent rows (columns), or short rows"
    if rows:
        per_thread = c["BLOCK_N"] * rows / (32 * c["num_warps"])
        low, high = COLUMN_PER_THREAD
        if not low <= per_thread <= high:
            return (f"a [{c['BLOCK_N']}, {rows}] tile over {c['num_warps']} warps is {per_thread:g} "
                    f"elements per thread, outside {low}..{high}")
    return None


def regs_per_thread(config: Config, problem: Problem) -> float:
    """32-bit registers per thread holding its share of one row tile (fp32, fp64 takes two)."""
    per_elem = 2 if problem.dtype == "float64" else 1
    return config["BLOCK_N"] * per_elem / (32 * config["num_warps"])


def regs_limit(profile: GpuProfile) -> int:
    """Registers per thread a whole-row tile may take, leaving the rest for the math on it."""
    return min(64, profile.max_registers_per_thread // 2)


def _single_fits(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    if c["SINGLE"] == 1 and p.cols > SINGLE_MAX_COLS:
        return f"SINGLE=1 needs cols <= {SINGLE_MAX_COLS}, got cols {p.cols}"
    if c["SINGLE"] == 1 and c["BLOCK_N"] < p.cols:
        return f"SINGLE=1 needs BLOCK_N >= cols, got BLOCK_N {c['BLOCK_N']} < cols {p.cols}"
    return None


def _loop_block(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    cover = next_pow2(p.cols)
    if c["SINGLE"] == 0 and c["BLOCK_N"] > cover:
        return f"looped BLOCK_N {c['BLOCK_N']} > {cover} = next_pow2(cols {p.cols})"
    return None


def _threads(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    per_thread = c["BLOCK_N"] * max(1, c.get("ROWS", 0)) / (32 * c["num_warps"])
    # One warp is the least a row can get, even when the row is shorter than 32.
    if per_thread < 1 and c["num_warps"] > 1:
        return (f"{c['num_warps']} warps leave {per_thread:g} elements per thread of "
                f"BLOCK_N {c['BLOCK_N']}")
    regs, limit = regs_per_thread(c, p), regs_limit(hw)
    if c["SINGLE"] == 1 and regs > limit:
        return (f"the row tile takes {regs:g} registers per thread over {c['num_warps']} warps "
                f"> {limit} on {hw.name}")
    return None


class RowwiseTemplate(KernelTemplate):
    kind = "rowwise"
    # Memory-bound: every candidate lands within a few percent of the copy-bandwidth floor, where
    # the model's ratios scatter (0.2x-2.7x on the H100 fixture), so none is pruned by its bound;
    # they compile in a fraction of a second each.
    bound_margin = 0.0
    params = ("BLOCK_N", "SINGLE")
    optional = ("ROWS",)              # the column form: ROWS adjacent rows a program
    sizes = ("rows", "cols", "passes")
    rules = (_single_fits, _loop_block, _threads, _columns)

    def joins(self, k: Kernel, shape: tuple, inner: list[int], graph, users: dict) -> bool:
        if k.reduce_dims != (len(k.shape) - 1,):
            return False                # a reduction over other dims stands alone
        full, keep, row = tuple(k.shape), tuple(k.shape[:-1]) + (1,), tuple(k.shape[:-1])
        fits = shape in {full, keep, row}
        # Row values are one scalar per program: a node of the full shape may mix them only in
        # their kept form ([T, 1]); a [T] value would broadcast along the row instead.
        held = [tuple(graph.node(i).shape) for i in inner]
        if shape == full:
            return fits and all(s in (full, keep, ()) for s in held)
        return fits and all(s in (keep, row, ()) and (s == () or len(s) == len(shape)) for s in held)

    def takes_reduction(self, k: Kernel, shape: tuple) -> bool:
        # Another reduction over the same rows: the row is already in registers.
        return tuple(k.shape) == shape and k.reduce_dims == (len(shape) - 1,)

    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        domain = tuple(k.shape)
        rank = len(domain)
        fused_row = k.reduce_dims == ((rank - 1,) if rank else ())
        kept = [d for d in range(rank) if d not in k.reduce_dims]
        perm = tuple(kept + list(k.reduce_dims))

        # A reduction over other dims takes only prologues (element-wise ops of its domain that
        # it alone reads, schedule.py), one per reduction where strided reductions share a kernel.
        prologue = set(k.nodes) if not fused_row else set()

        def level_of(n: Node) -> str:
            if n.op in (Op.SUM, Op.MEAN, Op.MAX, Op.MIN):
                return "row"
            if n.op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
                return "full"
            return "full" if tuple(n.shape) == domain and (fused_row or n.id in prologue) else "row"
        spec, operands, written = build(sched, k, level_of, perm, len(kept))
        return spec, Binding(tuple(operands), written, k.anchor, "input0", perm)

    def emit(self, e: Emitter) -> Emitted:
        return rowwise_columns(e) if e.config.get("ROWS", 0) else rowwise(e)

    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        kdom = tuple(domain[d] for d in b.perm)
        rows = kdom[:spec.row_dims]

        def line_up(_j: int, level: str, t):
            if level == "row":
                if t.dim() == len(domain) and t.shape[-1] == 1:
                    t = t.squeeze(-1)           # the kept form [T, 1] of a row value
                return align(t, rows)
            return align(t, domain).permute(b.perm)

        column_form = columns_fit(spec)

        def sizes(_tensors: dict) -> dict[str, int]:
            out = {"R": math.prod(rows), "C": math.prod(kdom[spec.row_dims:])}
            if column_form:         # the last kept dim, along which the column form takes its rows
                out["L"] = rows[-1]
            return out
        return Frame(kdom, line_up, sizes, kdom, out_perm=b.perm)

    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        rows = config.get("ROWS", 0)
        if not rows:
            return (ints["R"], 1, 1)
        return row_blocks_grid(ints["R"], ints["L"], rows)

    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        return not (variant.single and launch.ints["C"] > config["BLOCK_N"])

    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        passes = len(row_passes(spec).passes)          # walks along the row in the looped form
        flops = float(work * ints["R"] * max(1, ints["C"]))
        columns = _strided_columns(spec, strides)
        short = not columns and 0 < ints["C"] <= SHORT_COLS and columns_fit(spec)
        return Problem("rowwise", dtype, flops, moved, rows=ints["R"], cols=ints["C"], passes=passes,
                       elem_bytes=widest, columns=columns, short_rows=short)

    def shape_text(self, p: Problem) -> str:
        return f"{p.rows}x{p.cols}"

    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        return config.get("SINGLE", 0) == 1, False

    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        single = [make_config(BLOCK_N=next_pow2(p.cols), SINGLE=1, num_warps=w, num_stages=1)
                  for w in SINGLE_WARPS]
        looped = [make_config(BLOCK_N=b, SINGLE=0, num_warps=w, num_stages=1)
                  for b in LOOP_BLOCKS for w in LOOP_WARPS]
        columns = [make_config(BLOCK_N=b, SINGLE=0, ROWS=r, num_warps=w, num_stages=1)
                   for r in COLUMN_ROWS for b in COLUMN_BLOCKS for w in COLUMN_WARPS] \
            if p.columns or p.short_rows else []
        return single + looped + columns

    def default_config(self, p: Problem) -> Config:
        return make_config(BLOCK_N=1024, SINGLE=0, num_warps=4, num_stages=1)

    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        return scalar_peak(p.dtype, profile)

    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        threads = 32 * c["num_warps"]
        single = c["SINGLE"] == 1
        if c.get("ROWS", 0):
            # ROWS rows a program, their tiles coalesced along the rows: a stream over R / ROWS
            # programs, each with a [BLOCK_N, ROWS] tile in flight.
            tile = c["BLOCK_N"] * c["ROWS"]
            programs = -(-p.rows // c["ROWS"])
            per_sm = blocks_per_sm(hw, threads, BASE_REGS_PER_THREAD + tile / threads)
            memory = stream_s(p.bytes, programs, per_sm, tile * p.elem_bytes, hw, top.bandwidth)
            return max(memory, p.flops / top.flops, _serial_s(p, c, programs, per_sm, hw))
        regs = BASE_REGS_PER_THREAD + (2 * regs_per_thread(c, p) if single else regs_per_thread(c, p))
        per_sm = blocks_per_sm(hw, threads, regs)
        in_flight = min(c["BLOCK_N"], p.cols) * p.elem_bytes
        memory = stream_s(p.bytes, p.rows, per_sm, in_flight, hw, top.bandwidth)
        if single and regs > hw.max_registers_per_thread:
            memory *= SPILL_PENALTY
        if p.columns:
            # Each row walks a strided column: a whole sector moved for each element used.
            memory *= max(1.0, SECTOR_BYTES / p.elem_bytes)
        if not single:
            # The looped form reads the row again for every pass; cheap only while the rows in
            # progress stay in L1 (on an SM) or L2 (over the whole GPU).
            row_bytes = p.cols * p.elem_bytes
            reread = p.passes * p.rows * row_bytes
            if per_sm * row_bytes <= hw.max_shared_memory_per_sm_bytes // 2:
                speedup = L1_SPEEDUP
            elif min(p.rows, hw.sm_count * per_sm) * row_bytes <= hw.l2_bytes // 2:
                speedup = L2_SPEEDUP
            else:
                speedup = 1.0
            memory += reread / (top.bandwidth * speedup)
            memory = max(memory, _serial_s(p, c, p.rows, per_sm, hw))
        return max(memory, p.flops / top.flops)


def _serial_s(p: Problem, c: Config, programs: int, per_sm: int, hw: GpuProfile) -> float:
    """A looped program's floor: each step's tile is loaded, then reduced, before the next one's
    load is issued (one stage), so a program takes a memory latency per step of BLOCK_N along
    the row, and the programs run in waves. The bandwidth model alone let few programs with long
    loops look fast: the column form over GPT-2's [8192, 50257] logits (64 programs of 786 steps)
    was predicted at 0.24 ms and ran 3.65 ms on an H200, where the row form (8192 programs of 13
    steps) ran 0.32 ms."""
    steps = p.passes * -(-max(1, p.cols) // c["BLOCK_N"])
    waves = -(-programs // (hw.sm_count * max(1, per_sm)))
    return waves * steps * MEMORY_LATENCY_S


def _strided_columns(spec: KernelSpec, strides: tuple) -> bool:
    """Whether a full-level operand has adjacent rows adjacent in memory (unit stride along the
    last kept dim) and a strided reduced dim, and the spec fits the column form."""
    if not strides or not columns_fit(spec):
        return False
    nrow = spec.row_dims
    for (dtype, level), st in zip(spec.operands, strides):
        # (A stride of 0 along the reduced dim is a per-row value broadcast, read once a row.)
        if level == "full" and len(st) > nrow and st[nrow - 1] == 1 and st[-1] not in (0, 1):
            return True
    return False


TEMPLATE = RowwiseTemplate()
