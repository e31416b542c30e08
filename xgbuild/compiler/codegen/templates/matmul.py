"""The matmul kernel kind: a tiled GEMM over batch dims with an element-wise epilogue (source in
`triton_matmul.py`), its launch (a vector operand is a matrix of one row or column, so the domain
is always batch + (M, N); a 2-D product can run in blocks of rows), its config space and pruning
rules, and its cost model (tiles quantized into waves, operand panels re-read per tile less what
GROUP_M lets L2 serve, shared memory feeding the products)."""

from __future__ import annotations

import math

from xgbuild.hw import GpuProfile

from ....dtypes import ITEMSIZE
from ...ir.graph import BINARY, UNARY, Op
from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import INT32_MAX, Frame, Launch, Variant, align
from ..spec import Binding, KernelSpec
from ..triton_matmul import matmul
from .base import Config, KernelTemplate, Problem, config_key, make_config, next_pow2
from .local import build, domain_level
from .roofline import (BASE_REGS_PER_THREAD, L2_SPEEDUP, MEMORY_LATENCY_S, MIN_ACC_ELEMENTS_PER_THREAD,
                       SMEM_HEADROOM_BYTES, blocks_per_sm, matmul_peak, over_smem, pipelined_feed, stream_s,
                       tensor_cores, tf32x3, tf32x3_rule)

BLOCK_M = (16, 32, 64, 128, 256)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (32, 64, 128)
GROUP_M = 8
WARPS = (4, 8)
STAGES = (2, 3, 4, 5)
# Configs sharing one (BLOCK_M, BLOCK_N) tile taken before the rest by rank: the cost model is
# coarse about stages and warps, so the timed set should span tile shapes, not one shape's variants.
PER_TILE_SHAPE = 4
# An fp32 accumulator tile spread over the block's threads; more than this spills on every GPU XG
# targets, whatever the per-thread maximum, once operand fragments and addresses are counted.
MAX_ACC_REGS_PER_THREAD = 128
# A k-slice of a tile row is at most this many bytes: 64 bf16, 32 fp32 elements (one 128-byte line,
# the widest shared-memory swizzle), and never fewer than the smallest BLOCK_K (32, for fp64). On an
# H100 every bf16 tile ran slower with 256-byte slices (128x256x128 at 2 stages 0.270 ms against
# 0.182 at BLOCK_K 64, bf16 4096^3), and for fp32/fp64 (CUDA-core FMA dots) operand fragments in
# registers grow with BLOCK_K.
MAX_K_SLICE_BYTES = 128
# Operand dtypes whose configs get a persistent TMA twin (`full_space`).
PERSISTENT_DTYPES = ("bfloat16", "float16")
# An epilogue of at least this many element-wise ops per output runs over column slices of the
# tile (`SUBTILES`, `triton_matmul._epilogue`), each slice at most SLICE_ELEMENTS_PER_THREAD
# accumulator elements a thread. GELU's backward (47 ops) spilled on sm_90 at every tile whole
# (128x128 over 8 warps: 2.1 KB a thread; ptxas -v); in slices of 16 a thread none did, 128x256
# included (242 registers), and on an H200 the whole-tile kernel's best was 0.25 ms against
# 0.069 ms for the bare product.
HEAVY_EPILOGUE_OPS = 8
SLICE_ELEMENTS_PER_THREAD = 16


def smem_bytes(config: Config, elem_bytes: int) -> int:
    """Shared memory one matmul block asks for: the pipelined A and B tiles plus headroom."""
    tile = config["BLOCK_M"] * config["BLOCK_K"] + config["BLOCK_K"] * config["BLOCK_N"]
    return tile * elem_bytes * config["num_stages"] + SMEM_HEADROOM_BYTES


def acc_regs_per_thread(config: Config, problem: Problem) -> float:
    """32-bit registers per thread holding the accumulator (fp64 accumulators take two)."""
    per_elem = 2 if problem.dtype == "float64" else 1
    threads = 32 * config["num_warps"]
    return config["BLOCK_M"] * config["BLOCK_N"] * per_elem / threads


def _tile_vs_problem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    for param, size, least in (("BLOCK_M", p.m, 16), ("BLOCK_N", p.n, 32), ("BLOCK_K", p.k, 32)):
        cover = max(least, next_pow2(size))
        if c[param] > cover:
            return f"{param} {c[param]} > {cover}, the most a size of {size} needs"
    return None


def _k_slice(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    limit = max(BLOCK_K[0], MAX_K_SLICE_BYTES // p.elem_bytes)
    if c["BLOCK_K"] > limit:
        return f"BLOCK_K {c['BLOCK_K']} > {limit} for {p.elem_bytes}-byte {p.dtype} operands"
    return None


def _smem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    return over_smem(smem_bytes(c, p.elem_bytes), hw)


def _regs(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    acc = acc_regs_per_thread(c, p)
    limit = min(MAX_ACC_REGS_PER_THREAD, hw.max_registers_per_thread - BASE_REGS_PER_THREAD)
    if acc > limit:
        return (f"accumulator takes {acc:g} registers per thread > {limit} "
                f"({c['BLOCK_M']}x{c['BLOCK_N']} over {c['num_warps']} warps)")
    if acc < MIN_ACC_ELEMENTS_PER_THREAD:
        return (f"a {c['BLOCK_M']}x{c['BLOCK_N']} tile over {c['num_warps']} warps is {acc:g} "
                f"accumulator elements per thread < {MIN_ACC_ELEMENTS_PER_THREAD}")
    return None


def _ab_bytes(p: Problem, c: Config, hw: GpuProfile, slots: int) -> float:
    """HBM bytes of A and B reads: each tile reads a row panel of A and a column panel of B."""
    grid_m, grid_n = math.ceil(p.m / c["BLOCK_M"]), math.ceil(p.n / c["BLOCK_N"])
    a_bytes = p.batch * p.m * p.k * p.elem_bytes
    b_bytes = p.batch * p.k * p.n * p.elem_bytes
    if a_bytes + b_bytes <= hw.l2_bytes // 2:
        return a_bytes + b_bytes  # everything stays in L2 after the first read
    # Tiles running together (one wave) cover GROUP_M row panels by the columns the wave reaches,
    # so within a wave each A panel and each B panel is read from HBM once.
    wave = min(slots, p.batch * grid_m * grid_n)
    group_rows = min(c["GROUP_M"], grid_m, wave)
    group_cols = min(grid_n, math.ceil(wave / group_rows))
    panel_a = c["BLOCK_M"] * p.k * p.elem_bytes
    panel_b = p.k * c["BLOCK_N"] * p.elem_bytes
    waves = p.batch * grid_m * grid_n / wave
    return max(a_bytes + b_bytes, waves * (group_rows * panel_a + group_cols * panel_b))


def epilogue_ops(p: Problem) -> float:
    """Element-wise ops per output element of the product's epilogue (from the problem's flops)."""
    outputs = p.batch * p.m * p.n
    return (p.flops - 2.0 * outputs * p.k) / outputs if outputs else 0.0


def _slices(p: Problem, bm: int, bn: int, warps: int) -> dict[str, int]:
    """`SUBTILES` for a tile: {} for a light epilogue, else the fewest halvings of the tile's
    columns that bring a slice to SLICE_ELEMENTS_PER_THREAD accumulator elements a thread."""
    if epilogue_ops(p) < HEAVY_EPILOGUE_OPS:
        return {}
    parts = 1
    while bm * bn / (32 * warps * parts) > SLICE_ELEMENTS_PER_THREAD and bn // (2 * parts) >= 16:
        parts *= 2
    return {"SUBTILES": parts} if parts > 1 else {}


class MatmulTemplate(KernelTemplate):
    kind = "matmul"
    params = ("BLOCK_K", "BLOCK_M", "BLOCK_N", "GROUP_M", "TF32X3")
    optional = ("PROGRAMS", "TMA", "SUBTILES")      # a persistent TMA kernel, an epilogue in slices (`triton_matmul.py`)
    sizes = ("batch", "m", "n", "k")
    tiled = True
    rules = (tf32x3_rule, _tile_vs_problem, _k_slice, _smem, _regs)

    def joins(self, k: Kernel, shape: tuple, inner: list[int], graph, users: dict) -> bool:
        # An epilogue pays when it replaces the product in memory; when the product is written
        # anyway, a consumer is better fused downstream (no second tensor written). A value that
        # only element-wise ops of the product's shape read (GELU's tanh form reads x four times)
        # stays in registers when they all join: the epilogue is then the whole activation.
        anchor = tuple(graph.node(k.anchor).shape)
        return shape == anchor and all(len(users[i]) == 1 or _pointwise_region(graph, users, i, anchor)
                                       for i in inner)

    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        g = sched.graph
        # The domain is batch + (M, N): a vector operand adds its size-1 dim.
        rank = len(k.shape) + sum(len(g.node(i).shape) == 1 for i in g.node(k.anchor).inputs)
        spec, operands, written = build(sched, k, domain_level(len(k.shape)), rank=rank)
        return spec, Binding(tuple(operands), written, k.nodes[0], "shape")

    def emit(self, e: Emitter) -> Emitted:
        return matmul(e)

    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        # A vector operand is a matrix of one row (A) or one column (B): the kernel's domain is
        # always batch + (M, N), and values shaped like the product gain that size-1 dim.
        node = graph.node(b.domain)
        a_shape, b_shape = (tuple(graph.node(i).shape) for i in node.inputs[:2])
        a_vec, b_vec = len(a_shape) == 1, len(b_shape) == 1
        K = int(a_shape[-1])
        M = 1 if a_vec else int(a_shape[-2])
        N = 1 if b_vec else int(b_shape[-1])
        batch = domain[:len(domain) - (not a_vec) - (not b_vec)]
        ja, jb = spec.matmul

        def line_up(j: int, _level: str, t):
            if j in spec.matmul:
                want = batch + ((M, K) if j == ja else (K, N))
                if j == jb and b_vec:
                    t = t.reshape(K, 1)
                return align(t, want)
            t = align(t, domain)
            if a_vec:
                t = t.unsqueeze(len(batch))
            return t.unsqueeze(-1) if b_vec else t

        def sizes(_tensors: dict) -> dict[str, int]:
            return {"M": M, "N": N, "K": K, "batch": math.prod(batch)}
        return Frame(batch + (M, N), line_up, sizes, batch)

    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        tiles = -(-ints["M"] // config["BLOCK_M"]) * -(-ints["N"] // config["BLOCK_N"])
        if config.get("PROGRAMS", 0) > 0:       # persistent: the programs walk every batch's tiles
            return (min(config["PROGRAMS"], tiles * ints["batch"]), 1, 1)
        return (tiles, ints["batch"], 1)

    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        if not variant.wide and math.prod(launch.tensors["q0"].shape) > INT32_MAX:
            return False
        return not (variant.even_k and launch.ints["K"] % config["BLOCK_K"])

    def block_rows(self, spec: KernelSpec, b: Binding, graph) -> int:
        """The rows of a 2-D product (no batch dims, no gathered operands, every output shaped
        like the product, B read by the product alone), or 0. (A block reads B whole and the rest
        at its rows: an operand that is B and also read by the epilogue, say `W @ G + G`, or A
        too, would need both at once.)"""
        node = graph.node(b.domain)
        flat = node.op is Op.MATMUL and len(node.shape) == 2 and all(
            len(graph.node(i).shape) == 2 for i in node.inputs[:2]) and all(
            level not in ("gather", "table", "lead") for _dtype, level in spec.operands) and all(
            tuple(graph.node(o).shape) == tuple(node.shape) for o in b.outputs)
        ja, jb = spec.matmul[:2] if flat else (0, 0)
        epilogue_reads_b = any(arg[:2] == ("o", jb) for n in spec.nodes if n.op != "matmul" for arg in n.args)
        return int(node.shape[0]) if flat and ja != jb and not epilogue_reads_b else 0

    def rows_of(self, spec: KernelSpec, launch: Launch, r0: int, r1: int) -> Launch:
        """A's rows and those of every operand and output shaped like the product, B whole
        (sizes and strides otherwise the same)."""
        jb = spec.matmul[1]
        tensors: dict = {}
        layouts: list = []
        for name, t in launch.tensors.items():
            if name == "flags":
                tensors[name] = t
                continue
            j = int(name[1:])
            whole = name[0] == "p" and (j == jb or spec.operands[j][1] == "scalar")
            tensors[name] = t if whole else t[r0:r1]
            if name[0] == "p":
                if spec.operands[j][1] == "scalar":
                    layouts.append(("dense", ()))
                else:
                    part = tensors[name]
                    layouts.append(("dense" if part.is_contiguous() else tuple(part.stride()), tuple(part.shape)))
        return Launch(tensors, {**launch.ints, "M": r1 - r0}, layouts)

    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        a = spec.operands[spec.matmul[0]][0]
        batch = ints["batch"]
        flops = 2.0 * batch * ints["M"] * ints["N"] * ints["K"] + work * batch * ints["M"] * ints["N"]
        return Problem("matmul", a, flops, moved, batch=batch, m=ints["M"], n=ints["N"], k=ints["K"],
                       elem_bytes=ITEMSIZE[a], b_transposed=_b_transposed(spec, ints, strides))

    def shape_text(self, p: Problem) -> str:
        return f"{p.batch}x{p.m}x{p.n}x{p.k}"

    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        return False, p.k % config["BLOCK_K"] == 0

    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        # float32 products: exact FMA (TF32X3=0) or three TF32 tensor-core products (see the
        # `roofline.tf32x3_rule`, `triton_matmul.py` and the tuner's gate, which admits them only as
        # accurate as float32's own). 16-bit products: each config and its persistent TMA twin,
        # one program per SM of `hw` (`preselect` keeps both forms). With B stored [N, K] the
        # pointer kernel's transposed B tiles cost it 10-12% on an H200 (docs/codegen.md). With B
        # stored [K, N] the pointer kernel won an MLP's 4096x3072x2048, but GPT-2's training step
        # has products whose epilogue reads and writes float32 (a bias and the residual stream): its
        # 8192x768x3072 and 8192x768x768 ran 69 and 31 us as twins against 77 and 37 (0.26 ms a
        # step on an H200). Measurement picks per job; the twins' compiles (slower: the flattened
        # loop) are the price, paid once a kernel in the cache.
        x3s = (0, 1) if p.dtype == "float32" else (0,)
        plain = [make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, TF32X3=x3,
                             num_warps=w, num_stages=s, **_slices(p, bm, bn, w))
                 for x3 in x3s for bm in BLOCK_M for bn in BLOCK_N for bk in BLOCK_K
                 for w in WARPS for s in STAGES]
        if hw is None or p.dtype not in PERSISTENT_DTYPES:
            return plain
        return plain + [make_config(**c, PROGRAMS=hw.sm_count, TMA=1) for c in plain]

    def default_config(self, p: Problem) -> Config:
        # 64x64 tiles fit 99 KiB parts even for fp64 at 2 stages; BLOCK_K respects the k-slice rule.
        block_k = max(BLOCK_K[0], min(64, MAX_K_SLICE_BYTES // p.elem_bytes))
        stages = 3 if p.elem_bytes <= 4 else 2
        return make_config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=block_k, GROUP_M=GROUP_M, TF32X3=0,
                           num_warps=4, num_stages=stages)

    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        # a 3xTF32 matmul runs three TF32 tensor-core products per useful one
        return matmul_peak("tf32", profile) / 3 if tf32x3(config) else matmul_peak(p.dtype, profile)

    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        bm, bn, bk, stages = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_stages"]
        threads = 32 * c["num_warps"]
        smem = smem_bytes(c, p.elem_bytes)
        per_sm = blocks_per_sm(hw, threads, acc_regs_per_thread(c, p) + BASE_REGS_PER_THREAD, smem)
        if c.get("PROGRAMS", 0) > 0:    # a persistent kernel has PROGRAMS programs in all
            per_sm = max(1, min(per_sm, c["PROGRAMS"] // hw.sm_count))
        tiles = p.batch * math.ceil(p.m / bm) * math.ceil(p.n / bn)
        slots = hw.sm_count * per_sm

        sm_peak = top.flops / hw.sm_count
        step_flops = 2 * bm * bn * bk
        k_steps = math.ceil(p.k / bk)
        feed = pipelined_feed(p, c, hw, sm_peak)

        def sm_seconds(resident: int) -> float:
            """One SM running `resident` tiles at once, start to end: each k-step takes the longer
            of the math for all of them and a load's latency over the stages loaded ahead."""
            math_s = resident * step_flops / (sm_peak * feed)
            return k_steps * max(math_s, MEMORY_LATENCY_S / (stages - 1))

        # Wave quantization: each full wave runs `per_sm` tiles on every SM; the tail wave spreads its
        # tiles over the SMs, so the busiest SM sets its length while the others sit idle.
        full_waves, tail = divmod(tiles, slots)
        compute = full_waves * sm_seconds(per_sm)
        if tail:
            compute += sm_seconds(math.ceil(tail / hw.sm_count))

        ab = _ab_bytes(p, c, hw, slots)
        moved = p.bytes + max(0.0, ab - p.batch * (p.m + p.n) * p.k * p.elem_bytes)
        in_flight = (stages - 1) * (bm + bn) * bk * p.elem_bytes
        memory = stream_s(moved, tiles, per_sm, in_flight, hw, top.bandwidth)
        # Every tile loads its A row panel and B column panel through L2, hit or miss.
        loaded = tiles * k_steps * bk * (bm + bn) * p.elem_bytes
        memory = max(memory, loaded / (top.bandwidth * L2_SPEEDUP))
        return max(compute, memory, p.flops / top.flops)

    def tie_break(self, p: Problem, config: Config) -> tuple:
        """The larger tile, then a 128-byte k-slice, then fewer stages (on an H100, with bf16
        4096^3: 128x256x64 0.182 ms, 128x256x32 0.185, 128x128x64 0.212, 128x128x32 0.245, and
        128x256x128 at 2 stages 0.270), then the config's canonical text: many large-GEMM tiles
        reach the model's roofline alike."""
        area = config["BLOCK_M"] * config["BLOCK_N"]
        if not (tensor_cores(p.dtype) or tf32x3(config)):
            area = min(area, 128 * 128)     # CUDA-core dots ran alike from 64x64 to 128x128 (fp32 4096^3)
        return (-area, abs(config["BLOCK_K"] * p.elem_bytes - 128), config["num_stages"],
                config.get("PROGRAMS", 0) > 0, config_key(config))

    def preselect(self, p: Problem, ranked: list[Config], limit: int, best, split: bool
                  ) -> tuple[set[str], int]:
        chosen: set[str] = set()
        if split and any(c["TF32X3"] for c in ranked):
            # Exact-product configs keep half the slots: the tuner's gate may reject every 3xTF32 one
            # (short K, where float32's own error is tiny), and a job must still get a winner.
            half = limit // 2
            exact = best([c for c in ranked if not c["TF32X3"]], limit - half)
            x3 = best([c for c in ranked if c["TF32X3"]], half)
            chosen = {config_key(c) for c in exact + x3}
            return chosen, len(chosen)
        if split and any(c.get("PROGRAMS", 0) for c in ranked):
            # Persistent twins are kept beside the plain configs, never instead of them: the plain
            # set is what it would be without them, and measurement picks between the two forms.
            plain = best([c for c in ranked if not c.get("PROGRAMS", 0)], limit)
            twins = best([c for c in ranked if c.get("PROGRAMS", 0)], limit)
            chosen = {config_key(c) for c in plain + twins}
            return chosen, len(chosen)
        per_shape: dict[tuple[int, int], int] = {}
        for config in ranked:
            shape = (config["BLOCK_M"], config["BLOCK_N"])
            if len(chosen) < limit and per_shape.get(shape, 0) < PER_TILE_SHAPE:
                per_shape[shape] = per_shape.get(shape, 0) + 1
                chosen.add(config_key(config))
        return chosen, limit


TEMPLATE = MatmulTemplate()


def _b_transposed(spec: KernelSpec, ints: dict[str, int], strides: tuple) -> bool:
    """Is B stored [N, K], K contiguous (its strides along K and N, the last two of its level)?"""
    jb = spec.matmul[1]
    if jb >= len(strides) or ints["N"] < 2 or ints["K"] < 2 or len(strides[jb]) < 2:
        return False
    sk, sn = strides[jb][-2:]
    return sk == 1 and sn != 1


def _pointwise_of(n, shape: tuple) -> bool:
    """Is `n` an element-wise op that reads tensors, of `shape`?"""
    return (n.op in UNARY or n.op in BINARY or n.op is Op.WHERE) and tuple(n.shape) == shape


MAX_REGION = 64


def _pointwise_region(graph, users: dict, i: int, shape: tuple) -> bool:
    """May every reader of `i` (a value the epilogue holds) join the epilogue, so that `i` never
    goes to memory? Yes when they are element-wise ops of `shape` and so, transitively, is the
    region they start, except where it ends, and no op of the region reads a value computed from
    `i` outside it (rmsnorm's `x * rsqrt(mean(x * x))`: the mean needs all of `x` first, so `x`
    is written anyway and its square belongs in the row kernel's prologue)."""
    region: set[int] = set()
    stack = [i]
    while stack:
        v = stack.pop()
        for u in users[v]:
            if u in region:
                continue
            if not _pointwise_of(graph.node(u), shape):
                if v == i:
                    return False        # `i` itself is read elsewhere: it is written anyway
                continue                # a value of the region read elsewhere: the region ends there
            region.add(u)
            if len(region) > MAX_REGION:
                return False
            stack.append(u)
    outside = {j for r in region for j in graph.node(r).inputs
               if j != i and j not in region and graph.node(j).shape != ()}
    if not outside:                     # (a GELU reads only `i` and scalars: nothing to trace)
        return True
    position = {n.id: k for k, n in enumerate(graph.nodes)}
    return not any(_depends_on(graph, j, i, position, position[i]) for j in outside)


def _depends_on(graph, j: int, i: int, position: dict, start: int) -> bool:
    """Is `j` computed from `i`? (Graphs are in program order: only nodes after `i` can be.)"""
    stack, seen = [j], set()
    while stack:
        v = stack.pop()
        if v == i:
            return True
        if v in seen or position[v] <= start:
            continue
        seen.add(v)
        stack.extend(graph.node(v).inputs)
    return False
