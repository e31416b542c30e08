"""The scatter kernel kind: `scatter_add(idx, src, rows=M)`, rows of src added into a table at
run-time indices (an embedding's gradient), one op a kernel (source in `triton_scatter.py`): its
launch (idx [K] and src [K, N] in their own shapes, the table [M, N] the domain), its config space
and pruning rules, and its cost model (each program scans every index block and multiplies only
the blocks holding one of its rows)."""

from __future__ import annotations

import math

from xgbuild.hw import GpuProfile

from ....dtypes import ITEMSIZE
from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Frame, Launch, Variant
from ..spec import Binding, KernelSpec, LocalNode
from ..triton_scatter import scatter
from .base import Config, KernelTemplate, Problem, config_key, make_config, next_pow2
from .roofline import (BASE_REGS_PER_THREAD, L2_SPEEDUP, MEMORY_LATENCY_S, MIN_ACC_ELEMENTS_PER_THREAD,
                       SMEM_HEADROOM_BYTES, blocks_per_sm, matmul_peak, over_smem, stream_s)

BLOCK_M = (32, 64, 128)
BLOCK_N = (64, 128, 256)
BLOCK_K = (32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2)
MAX_ACC_REGS_PER_THREAD = 128


def smem_bytes(c: Config, elem_bytes: int) -> int:
    """Shared memory one program asks for: the pipelined one-hot and src tiles plus headroom."""
    tile = c["BLOCK_M"] * c["BLOCK_K"] + c["BLOCK_K"] * c["BLOCK_N"]
    return tile * elem_bytes * max(1, c["num_stages"]) + SMEM_HEADROOM_BYTES


def acc_regs_per_thread(c: Config, p: Problem) -> float:
    """32-bit registers per thread holding the accumulator (float64 accumulators take two)."""
    return c["BLOCK_M"] * c["BLOCK_N"] * (2 if p.dtype == "float64" else 1) / (32 * c["num_warps"])


def _smem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    return over_smem(smem_bytes(c, p.elem_bytes), hw)


def _regs(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    acc = acc_regs_per_thread(c, p)
    if acc > MAX_ACC_REGS_PER_THREAD:
        return f"accumulator takes {acc:g} registers per thread > {MAX_ACC_REGS_PER_THREAD}"
    if acc < MIN_ACC_ELEMENTS_PER_THREAD:
        return f"a {c['BLOCK_M']}x{c['BLOCK_N']} tile over {c['num_warps']} warps is too few elements per thread"
    return None


def _tile_vs_problem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    for param, size, least in (("BLOCK_M", p.m, BLOCK_M[0]), ("BLOCK_N", p.n, BLOCK_N[0]), ("BLOCK_K", p.k, BLOCK_K[0])):
        cover = max(least, next_pow2(size))
        if c[param] > cover:
            return f"{param} {c[param]} > {cover}, the most a size of {size} needs"
    return None


def hit_rate(p: Problem, block_m: int, block_k: int) -> float:
    """The share of index blocks that hold one of a program's rows, for indices spread evenly."""
    return 1.0 - (1.0 - min(1.0, block_m / max(1, p.m))) ** block_k


class ScatterTemplate(KernelTemplate):
    kind = "scatter"
    params = ("BLOCK_K", "BLOCK_M", "BLOCK_N")
    sizes = ("m", "n", "k")
    tiled = True
    max_candidates = 24
    # The model's scan latency and hit rate are rough (the hit rate depends on the indices): measure
    # every candidate the model keeps.
    bound_margin = 0.0
    rules = (_tile_vs_problem, _smem, _regs)

    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        """One local node reading the indices and the rows as operands of their own ("full")."""
        g = sched.graph
        n = g.node(k.anchor)
        idx, src = (g.node(i) for i in n.inputs)
        local = LocalNode(n.op.value, (("o", 0), ("o", 1)), n.dtype, "full")
        spec = KernelSpec("scatter", 2, ((idx.dtype, "full"), (src.dtype, "full")), (local,), (0,))
        return spec, Binding((idx.id, src.id), (n.id,), n.id, "shape")

    def emit(self, e: Emitter) -> Emitted:
        return scatter(e)

    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        # The indices [K] and rows [K, N] in their own shapes; the table [M, N] is the domain.
        tokens = int(graph.node(b.operands[0]).shape[0])

        def own(_j: int, _level: str, t):
            return t

        def sizes(_tensors: dict) -> dict[str, int]:
            return {"M": int(domain[0]), "N": int(domain[1]), "K": tokens}
        return Frame(tuple(domain), own, sizes, ())

    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        return (-(-ints["M"] // config["BLOCK_M"]) * -(-ints["N"] // config["BLOCK_N"]), 1, 1)

    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        return True

    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        src = spec.operands[1][0]
        m, n, k = ints["M"], ints["N"], ints["K"]
        return Problem("scatter", src, 2.0 * k * n, moved, m=m, n=n, k=k, elem_bytes=ITEMSIZE[src])

    def shape_text(self, p: Problem) -> str:
        return f"{p.m}x{p.n}x{p.k}"

    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        return False, False

    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        return [make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s)
                for bm in BLOCK_M for bn in BLOCK_N for bk in BLOCK_K for w in WARPS for s in STAGES]

    def default_config(self, p: Problem) -> Config:
        return make_config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=1)

    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        return matmul_peak(p.dtype, profile)

    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        """Programs over table tiles; each scans ceil(K / BLOCK_K) index blocks, one dependent load
        each (a memory latency, shared by the programs resident on an SM), and multiplies the
        blocks that hold one of its rows (`hit_rate`), their src blocks read through L2."""
        bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
        threads = 32 * c["num_warps"]
        regs = acc_regs_per_thread(c, p) + BASE_REGS_PER_THREAD
        per_sm = blocks_per_sm(hw, threads, regs, smem_bytes(c, p.elem_bytes))
        programs = math.ceil(p.m / bm) * math.ceil(p.n / bn)
        steps = math.ceil(p.k / bk)
        hits = hit_rate(p, bm, bk) * steps
        waves = math.ceil(programs / (hw.sm_count * per_sm))
        scan = waves * steps * MEMORY_LATENCY_S * (0.5 if c["num_stages"] > 1 else 1.0)
        sm_peak = top.flops / hw.sm_count
        products = programs * hits * 2.0 * bm * bn * bk / (sm_peak * hw.sm_count)
        loaded = programs * hits * bk * bn * p.elem_bytes / (top.bandwidth * L2_SPEEDUP)
        written = stream_s(p.m * p.n * p.elem_bytes, programs, per_sm, bm * bn * p.elem_bytes, hw, top.bandwidth)
        return max(scan + products, loaded, written)

    def tie_break(self, p: Problem, config: Config) -> tuple:
        return (config["num_stages"], config_key(config))


TEMPLATE = ScatterTemplate()
