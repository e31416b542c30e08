"""The attention kernel kind: `softmax(chain(q @ kT)) @ v` as one flash-style kernel (source in
`triton_attention.py`), its launch (q, kT and v line up with their own matrix dims, what the score
chain reads with the scores), its config space and pruning rules, and its cost model (a matmul
whose k-steps are key blocks, plus the softmax's exps)."""

from __future__ import annotations

import math

from xgbuild.hw import GpuProfile

from ....dtypes import ITEMSIZE
from ....errors import ExecutionError
from ...ir.graph import Op
from ...ir.shapes import index_axis
from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Frame, Launch, Variant, align
from ..spec import Binding, KernelSpec, LocalNode, const
from ..triton_attention import attention, causal
from .base import Config, KernelTemplate, Problem, config_key, make_config, next_pow2
from .roofline import (BASE_REGS_PER_THREAD, L2_SPEEDUP, MEMORY_LATENCY_S, MIN_ACC_ELEMENTS_PER_THREAD,
                       SMEM_HEADROOM_BYTES, SPILL_PENALTY, blocks_per_sm, matmul_peak, over_smem, smem_feed,
                       stream_s, tf32x3, tf32x3_rule)

BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (16, 32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2, 3, 4)
# The head dim is one tile up to this (q's rows loaded once); wider heads loop over D in chunks of
# half of it, and wider v heads are split over programs.
MAX_HEAD = 256
# A fused attention kernel on CUDA-core FMA products (float32 and float64 operands: no tensor cores)
# holds its score tile, the output accumulator and both products' operand fragments in registers.
# On an H100 (fp32, 8x12 heads of 512x64, every candidate measured) each config with at most 16
# score elements per thread ran in 0.35-0.81 ms, while 32 or more ran 3.5-13.5 ms in 13 of 20
# cases (spills): 128x128 over 8 warps, the model's pick, took 12.8 ms against 0.35 for 32x64/4.
MAX_FMA_SCORES_PER_THREAD = 16
# exp() results per clock per SM (the special function units: 16 on Hopper): the softmax inside
# a fused attention kernel runs between the two products, not beside them, without warp
# specialisation.
EXP_PER_CLOCK_PER_SM = 16


def head_blocks(problem: Problem) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DV): the whole head dims (at least 16, tl.dot's least) up to MAX_HEAD,
    else half of that per chunk."""
    def block(size: int) -> int:
        full = max(16, next_pow2(size))
        return full if full <= MAX_HEAD else MAX_HEAD // 2
    return block(problem.k), block(problem.dv)


def smem_bytes(config: Config, elem_bytes: int) -> int:
    """Shared memory one attention block asks for: q's tile, the pipelined k and v tiles, the
    probabilities on their way to the second product, and headroom."""
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    kv = bn * (config["BLOCK_D"] + config["BLOCK_DV"]) * config["num_stages"]
    return (bm * config["BLOCK_D"] + kv + bm * bn) * elem_bytes + SMEM_HEADROOM_BYTES


def regs_per_thread(config: Config, elem_bytes: int = 2) -> float:
    """32-bit registers per thread for the output accumulator and the score tile (fp32), the
    probabilities (counted at half: 16-bit operands of the second product, or reusing the scores),
    and q's tile, which the tuned (`single`) variant keeps live across the key loop."""
    bm = config["BLOCK_M"]
    q_tile = bm * config["BLOCK_D"] * elem_bytes / 4
    return (bm * (config["BLOCK_DV"] + 1.5 * config["BLOCK_N"]) + q_tile) / (32 * config["num_warps"])


def key_steps(p: Problem, block_m: int, block_n: int) -> float:
    """Key blocks one program visits, averaged over the query blocks (causal: up to its diagonal)."""
    m_blocks = math.ceil(p.m / block_m)
    if not p.causal:
        return float(math.ceil(p.n / block_n))
    return sum(math.ceil(min(p.n, (i + 1) * block_m) / block_n) for i in range(m_blocks)) / m_blocks


def tiles_within(least: int):
    """The pruning rule that drops BLOCK_M or BLOCK_N past what the problem's T or S needs
    (next power of two, at least `least`)."""
    def rule(p: Problem, c: Config, hw: GpuProfile) -> str | None:
        for param, size in (("BLOCK_M", p.m), ("BLOCK_N", p.n)):
            cover = max(least, next_pow2(size))
            if c[param] > cover:
                return f"{param} {c[param]} > {cover}, the most a size of {size} needs"
        return None
    return rule


_tile_vs_problem = tiles_within(16)


def _smem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    return over_smem(smem_bytes(c, p.elem_bytes), hw)


def _regs(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    regs = regs_per_thread(c, p.elem_bytes)
    limit = hw.max_registers_per_thread - BASE_REGS_PER_THREAD
    if regs > limit:
        return (f"accumulator and scores take {regs:g} registers per thread > {limit} "
                f"({c['BLOCK_M']}x{c['BLOCK_N']}, v head {c['BLOCK_DV']}, over {c['num_warps']} warps)")
    if c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"]) < MIN_ACC_ELEMENTS_PER_THREAD:
        return (f"a {c['BLOCK_M']}x{c['BLOCK_N']} score tile over {c['num_warps']} warps is fewer than "
                f"{MIN_ACC_ELEMENTS_PER_THREAD} elements per thread")
    return None


def _fma_scores(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    if p.dtype not in ("float32", "float64") or tf32x3(c):
        return None
    per_thread = c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"])
    if per_thread > MAX_FMA_SCORES_PER_THREAD:
        return (f"{p.dtype} products run on CUDA cores: a {c['BLOCK_M']}x{c['BLOCK_N']} score tile over "
                f"{c['num_warps']} warps is {per_thread:g} elements per thread > {MAX_FMA_SCORES_PER_THREAD} "
                "(register spills)")
    return None


class AttentionTemplate(KernelTemplate):
    kind = "attention"
    params = ("BLOCK_D", "BLOCK_DV", "BLOCK_M", "BLOCK_N", "TF32X3")
    sizes = ("batch", "m", "n", "k", "dv")
    tiled = True
    # The model prices stages and warps alike where they measure 2x apart (H200: 64x64 tiles at 4
    # warps 0.43 ms, at 8 warps 0.88): it trusts the model less than matmul's 0.85, which pruned
    # the H200's winner (the fixture's h200 attention job; 0.8 is the boldest that keeps it).
    bound_margin = 0.75
    rules = (tf32x3_rule, _tile_vs_problem, _smem, _regs, _fma_scores)

    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        """An attention kernel: local nodes `matmul(q, kT)`, the score chain (with the index expressions
        it reads, `iota` at level "row" or "col"), `softmax`, casts, `matmul(p, v)`. Operands read by
        the chain are at level "full" (lined up with the scores) or "scalar"."""
        g = sched.graph
        inside = set(k.nodes)
        tree = set(k.inlined)
        out_rank = len(k.shape)
        score_rank = len(g.node(k.nodes[0]).shape)
        local: dict[int, int] = {}
        operands: list[tuple[str, str]] = []
        operand_nodes: list[int] = []
        nodes: list[LocalNode] = []

        def add(nid: int, node: LocalNode) -> tuple:
            local[nid] = len(nodes)
            nodes.append(node)
            return ("n", local[nid])

        index: dict[tuple[int, str], int] = {}

        def operand(nid: int, role: str = "") -> tuple:
            """Operand `nid`; q, kT and v (`role`) are always operands of their own, lined up with
            their own matrix dims, even when one node plays two roles."""
            src = g.node(nid)
            if src.op is Op.CONST and not role:
                return const(src.attr("value"), src.dtype)
            level = "scalar" if tuple(src.shape) == () and not role else "full"
            key = (nid, role or level)
            if key not in index:
                index[key] = len(operands)
                operands.append((src.dtype, level))
                operand_nodes.append(nid)
            return ("o", index[key])

        def side(nid: int) -> tuple:
            if nid in local:
                return ("n", local[nid])
            n = g.node(nid)
            if nid not in tree:
                return operand(nid)
            if n.op is Op.RESHAPE and g.node(n.inputs[0]).op is not Op.IOTA:
                ref = side(n.inputs[0])               # leading size-1 dims added: the same values
                if ref[0] == "n":
                    local[nid] = ref[1]
                return ref
            if n.op is Op.IOTA or n.op is Op.RESHAPE:
                return add(nid, LocalNode("iota", (), n.dtype, index_axis(n, score_rank)))
            attrs: tuple = (("value", const(n.attr("value"), n.dtype)[1]),) if n.op is Op.FULL else ()
            return add(nid, LocalNode(n.op.value, tuple(side(i) for i in n.inputs), n.dtype, "full", attrs))

        mm: list[int] = []
        lse: list[int] = []
        heads: list[int] = []       # views of the output it is written as (placement.merged_heads)
        for pos, nid in enumerate(k.nodes):
            n = g.node(nid)
            if n.op in (Op.RESHAPE, Op.TRANSPOSE) and (heads or n.inputs[0] == k.anchor):
                heads.append(nid)
            elif n.op is Op.ATTN_LSE:
                # The gradient's log-sum-exp of these scores (schedule.py): each row's, written too.
                add(nid, LocalNode("attn_lse", (), n.dtype, "row"))
                lse.append(nid)
            elif n.op is Op.MATMUL and pos == 0:
                a, b = operand(n.inputs[0], "q"), operand(n.inputs[1], "k")
                mm += [a[1], b[1]]
                add(nid, LocalNode("matmul", (), n.dtype, "full"))
            elif n.op is Op.MATMUL:
                v = operand(n.inputs[1], "v")
                mm.append(v[1])
                add(nid, LocalNode("matmul", (("n", local[n.inputs[0]]),), n.dtype, "full"))
            else:
                args = tuple(("n", local[i]) if i in inside else side(i) for i in n.inputs)
                attrs = (("safe", True),) if n.op is Op.SOFTMAX and n.attr("safe", False) else ()
                add(nid, LocalNode(n.op.value, args, n.dtype, "full", attrs))
        outs = [k.anchor] + lse
        spec = KernelSpec("attention", out_rank, tuple(operands), tuple(nodes), tuple(local[i] for i in outs), 0,
                          tuple(mm), strided_out=bool(heads))
        return spec, Binding(tuple(operand_nodes), tuple(heads[-1:] or [k.anchor]) + tuple(lse), k.anchor, "shape")

    def emit(self, e: Emitter) -> Emitted:
        return attention(e)

    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        # Domain: batch + (T, DV), the output's; q is batch + (T, D), kT batch + (D, S), v
        # batch + (S, DV), and what the score chain reads lines up with the scores, batch + (T, S).
        jq, jk, jv = spec.matmul
        q_shape, k_shape = (tuple(graph.node(b.operands[j]).shape) for j in (jq, jk))
        batch = domain[:-2]
        T, D, S, DV = int(q_shape[-2]), int(q_shape[-1]), int(k_shape[-1]), int(domain[-1])
        want_of = {jq: batch + (T, D), jk: batch + (D, S), jv: batch + (S, DV)}

        def sizes(_tensors: dict) -> dict[str, int]:
            return {"M": T, "N": S, "K": D, "DV": DV, "batch": math.prod(batch)}

        def out_view(i: int, out):
            """The output written as a view of the attention's (`spec.strided_out`): its buffer
            seen back through the views, in the domain's shape."""
            if i or not spec.strided_out:
                return None
            nid = b.outputs[0]
            while nid != b.domain:
                n = graph.node(nid)
                nid = n.inputs[0]
                out = out.transpose(n.attr("dim0"), n.attr("dim1")) if n.op is Op.TRANSPOSE \
                    else out.view(tuple(graph.node(nid).shape))
            if out.dim() and out.shape[-1] > 1 and out.stride(-1) != 1:
                raise ExecutionError("internal: an attention output written as merged heads needs a contiguous head dim")
            return out
        return Frame(domain, lambda j, _level, t: align(t, want_of.get(j, batch + (T, S))), sizes, batch,
                     out_view=out_view)

    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        tiles = -(-ints["M"] // config["BLOCK_M"]) * -(-ints["DV"] // config["BLOCK_DV"])
        return (tiles, ints["batch"], 1)

    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        return not (variant.single and launch.ints["K"] > config["BLOCK_D"])   # q's rows are loaded once, whole

    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        jq, jv = spec.matmul[0], spec.matmul[2]
        b, t, s, d, dv = ints["batch"], ints["M"], ints["N"], ints["K"], ints["DV"]
        skip = causal(spec)
        chain = sum(1 for n in spec.nodes if n.op not in ("matmul", "iota"))
        flops = (2.0 * b * t * s * (d + dv) + chain * b * t * s) * (0.5 if skip else 1.0)
        return Problem("attention", spec.operands[jq][0], flops, moved, batch=b, m=t, n=s, k=d,
                       dv=dv, causal=skip, elem_bytes=ITEMSIZE[spec.operands[jv][0]])

    def shape_text(self, p: Problem) -> str:
        return f"{p.batch}x{p.m}x{p.n}x{p.k}x{p.dv}" + ("c" if p.causal else "")

    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        return p.k <= config["BLOCK_D"], False

    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        # float32 operands: both products exact (FMA) or as three TF32 tensor-core products, as
        # the matmul template's TF32X3; the tuner admits those only as accurate as float32's own.
        bd, bdv = head_blocks(p)
        x3s = (0, 1) if p.dtype == "float32" else (0,)
        return [make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv, TF32X3=x3, num_warps=w, num_stages=s)
                for x3 in x3s for bm in BLOCK_M for bn in BLOCK_N for w in WARPS for s in STAGES]

    def default_config(self, p: Problem) -> Config:
        # Loops over D in chunks of 64 and splits v's columns by 64 over programs: any sizes.
        return make_config(BLOCK_M=64, BLOCK_N=32, BLOCK_D=64, BLOCK_DV=64, TF32X3=0, num_warps=4, num_stages=2)

    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        # three TF32 tensor-core products per useful one
        return matmul_peak("tf32", profile) / 3 if tf32x3(config) else matmul_peak(p.dtype, profile)

    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        """Like a matmul whose k-steps are key blocks: each does q @ kT over the head dim's chunks
        and p @ v (tensor-core products fed from shared memory), plus the softmax's exps on the
        SFUs. K and V come from HBM once per batch index and through L2 for every query block."""
        bm, bn, bd, bdv, stages = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"], c["num_stages"]
        threads = 32 * c["num_warps"]
        smem = smem_bytes(c, p.elem_bytes)
        regs = regs_per_thread(c, p.elem_bytes) + BASE_REGS_PER_THREAD
        per_sm = blocks_per_sm(hw, threads, regs, smem)
        programs = p.batch * math.ceil(p.m / bm) * math.ceil(p.dv / bdv)
        slots = hw.sm_count * per_sm
        steps = key_steps(p, bm, bn)
        chunks = math.ceil(p.k / bd)

        sm_peak = top.flops / hw.sm_count
        step_flops = 2 * bm * bn * (chunks * bd + bdv)
        feed = smem_feed(p, {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": c["num_warps"]}, hw, sm_peak)
        exp_s = bm * bn / (EXP_PER_CLOCK_PER_SM * hw.clock_boost_mhz * 1e6)

        def sm_seconds(resident: int) -> float:
            math_s = resident * (step_flops / (sm_peak * feed) + exp_s)
            return steps * max(math_s, MEMORY_LATENCY_S / max(1, stages - 1))

        full_waves, tail = divmod(programs, slots)
        compute = full_waves * sm_seconds(per_sm)
        if tail:
            compute += sm_seconds(math.ceil(tail / hw.sm_count))
        in_flight = max(1, stages - 1) * bn * (bd * chunks + bdv) * p.elem_bytes
        memory = stream_s(p.bytes, programs, per_sm, in_flight, hw, top.bandwidth)
        loaded = programs * steps * bn * (bd * chunks + bdv) * p.elem_bytes
        memory = max(memory, loaded / (top.bandwidth * L2_SPEEDUP))
        if regs > hw.max_registers_per_thread:
            compute *= SPILL_PENALTY
        return max(compute, memory, p.flops / top.flops)

    def tie_break(self, p: Problem, config: Config) -> tuple:
        # Larger tiles (fewer re-reads of K and V), then fewer stages.
        return (-config["BLOCK_M"] * config["BLOCK_N"], config["num_stages"], config_key(config))


TEMPLATE = AttentionTemplate()
