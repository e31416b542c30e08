"""The flash kernel kind: attention's backward ops (`attn_lse`, `attn_grad`, ops/attention.py),
one op a kernel (the gradients of k and v of one attention: one kernel), each recomputing its blocks of scores from q and kT (source in
`triton_flash.py`): its launch (every operand in its own shape, the batch dims shared), its config
space and pruning rules, and its cost model (a matmul whose k-steps are score blocks)."""

from __future__ import annotations

import math

from xgbuild.hw import GpuProfile

from ....dtypes import ITEMSIZE
from ...ir.graph import Op
from ...ir.strides import slot_strides
from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Frame, Launch, Variant
from ..placement import slots_of
from ..spec import Binding, KernelSpec, LocalNode, const
from ..triton_flash import flash, role
from .attention import key_steps, tiles_within
from .base import Config, KernelTemplate, Problem, config_key, make_config, next_pow2
from .roofline import (BASE_REGS_PER_THREAD, L2_SPEEDUP, MIN_ACC_ELEMENTS_PER_THREAD, SMEM_HEADROOM_BYTES,
                       SPILL_PENALTY, blocks_per_sm, matmul_peak, over_smem, smem_feed, stream_s)

BLOCK_M = (32, 64, 128)
BLOCK_N = (32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2, 3, 4)
# Head dims are one tile each (passes/flash.py matches attention only up to this).
MAX_HEAD = 256


def head_block(size: int) -> int:
    return max(16, next_pow2(size))


def smem_bytes(c: Config, elem_bytes: int) -> int:
    """The pipelined tiles of the loop (kT and v, or q and dO) and the score block on its way to a product."""
    bm, bn, bd, bdv = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"]
    loop = max(bm, bn) * (bd + bdv) * max(1, c["num_stages"])
    return (loop + bm * bn) * elem_bytes + SMEM_HEADROOM_BYTES


def regs_per_thread(c: Config, elem_bytes: int = 2, both: bool = False) -> float:
    """The score block and dp (fp32), the accumulator (one head wide; dk's and dv's for `both`)
    and the resident tiles."""
    bm, bn, bd, bdv = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"]
    resident = max(bm, bn) * (bd + bdv) * elem_bytes / 4
    acc = bn * (bd + bdv) if both else max(bm, bn) * max(bd, bdv)
    return (2 * bm * bn + acc + resident) / (32 * c["num_warps"])


def _both(p: Problem) -> bool:
    """The kernel makes dk and dv: its products are 2 (D + DV) wide per score (`problem`)."""
    per = p.flops / max(1.0, 2.0 * p.batch * p.m * p.n * (0.5 if p.causal else 1.0))
    return abs(per - 2 * (p.k + p.dv)) < 0.5


# The smallest score block is 32: a block past a short T or S is pruned only above that.
_tile_vs_problem = tiles_within(32)


def _smem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    return over_smem(smem_bytes(c, p.elem_bytes), hw)


def _regs(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    regs = regs_per_thread(c, p.elem_bytes, _both(p))
    limit = hw.max_registers_per_thread - BASE_REGS_PER_THREAD
    if regs > limit:
        return (f"scores, accumulator and tiles take {regs:g} registers per thread > {limit} "
                f"({c['BLOCK_M']}x{c['BLOCK_N']}, heads {c['BLOCK_D']}/{c['BLOCK_DV']}, {c['num_warps']} warps)")
    if c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"]) < MIN_ACC_ELEMENTS_PER_THREAD:
        return f"a {c['BLOCK_M']}x{c['BLOCK_N']} score block over {c['num_warps']} warps is too few elements per thread"
    return None


def _delta_o(graph, d, g: int) -> int:
    """The o that delta `d` = sum(cast?(g) * cast?(o)) reads beside dO `g` (schedule.py `_delta_chain`)."""
    leaves = []
    for i in graph.node(d.inputs[0]).inputs:
        x = graph.node(i)
        leaves.append(x.inputs[0] if x.op is Op.CAST else x.id)
    return leaves[1] if leaves[0] == g else leaves[0]


class FlashTemplate(KernelTemplate):
    kind = "flash"
    params = ("BLOCK_D", "BLOCK_DV", "BLOCK_M", "BLOCK_N")
    sizes = ("batch", "m", "n", "k", "dv")
    tiled = True
    # Measured on an H200, the model was 3.5x optimistic for the dk+dv kernel and ranked its tiles
    # in no useful order: its bound stopped after 8 of 39 candidates. Each attention has two flash
    # jobs of a few dozen candidates: all are measured.
    bound_margin = 0.0
    rules = (_tile_vs_problem, _smem, _regs)

    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        """One local node, the op, reading every tensor input as an operand of its own ("full") and
        the scale as a constant or a "scalar" operand. dq's kernel may compute its delta too
        (schedule.py `_delta_chain`): then its delta operand is o instead, and the delta (a `sum`
        local node after the op) is written when others read it."""
        g = sched.graph
        n = g.node(k.anchor)
        inside = set(k.nodes)
        delta = n.op is Op.ATTN_GRAD and len(n.inputs) > 5 and n.inputs[5] in inside
        operands: list[tuple[str, str]] = []
        nodes: list[int] = []
        args = []
        for pos, i in enumerate(n.inputs):
            if delta and pos == 5:
                i = _delta_o(g, g.node(i), n.inputs[3])
            src = g.node(i)
            if pos == len(n.inputs) - 1 and src.op is Op.CONST:
                args.append(const(float(src.attr("value")), src.dtype))
                continue
            args.append(("o", len(operands)))
            operands.append((src.dtype, "scalar" if pos == len(n.inputs) - 1 else "full"))
            nodes.append(i)
        # One local node per op: the gradient of k alone, or of k and then v (schedule.py pairs them).
        local, written = [], []
        for nid in k.nodes:
            m = g.node(nid)
            if m.op not in (Op.ATTN_LSE, Op.ATTN_GRAD):
                continue
            attrs = tuple(sorted((key, value) for key, value in m.attrs if key in ("wrt", "causal", "fill")))
            local.append(LocalNode(m.op.value, tuple(args), m.dtype, "full", attrs + ((("delta", "o"),) if delta else ())))
            written.append(nid)
        outputs = tuple(range(len(local)))
        if delta:
            d = g.node(n.inputs[5])
            local.append(LocalNode("sum", (("o", 3), ("o", 5)), d.dtype, "row", ()))
            if d.id in sched.outputs(k):
                outputs += (len(local) - 1,)
                written.append(d.id)
        placed = slots_of(g, k.nodes)
        if placed is not None:
            # dk and dv written into their slots of one tensor, dq (the operand after the others)
            # copied into its own (placement.py `placed_grads`): one output, that tensor.
            top, gq, dim, axes, slots = placed
            operands.append((g.node(gq).dtype, "full"))
            nodes.append(gq)
            wrt = [dict(m.attrs).get("wrt") for m in local]
            local.append(LocalNode("place", (("n", wrt.index("k")), ("n", wrt.index("v")), ("o", len(operands) - 1)),
                                   g.node(top).dtype,
                                   "full", (("axes", axes), ("dim", dim), ("slots", slots))))
            outputs, written = (len(local) - 1,), [top]
        spec = KernelSpec("flash", len(n.shape) + (1 if n.op is Op.ATTN_LSE else 0), tuple(operands), tuple(local),
                          outputs)
        return spec, Binding(tuple(nodes), tuple(written), n.id, "shape")

    def emit(self, e: Emitter) -> Emitted:
        return flash(e)

    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        # Every operand in its own shape: q batch + (T, D), kT batch + (D, S), v batch + (S, DV),
        # dO batch + (T, DV), lse and delta batch + (T, 1) (a unit dim, so all are of one rank).
        q_shape, k_shape = (tuple(graph.node(b.operands[j]).shape) for j in (0, 1))
        batch = q_shape[:-2]
        T, D, S = int(q_shape[-2]), int(q_shape[-1]), int(k_shape[-1])
        v_shape = tuple(graph.node(b.operands[2]).shape) if len(b.operands) > 3 else None
        DV = int(v_shape[-1]) if v_shape else D

        def lined(j: int, _level: str, t):
            return t.unsqueeze(-1) if t.dim() == len(batch) + 1 else t

        keys = 1 if role(spec) in ("k", "v", "kv") else 0
        place = next((dict(m.attrs) for m in spec.nodes if m.op == "place"), None)

        def sizes(tensors: dict) -> dict[str, int]:
            out = {"M": T, "N": S, "K": D, "DV": DV, "batch": math.prod(batch), "KEYS": keys}
            if place is not None:       # the slots' strides, seen as the gradients' own dims
                strides = tuple(int(x) for x in tensors["q0"].stride())
                out |= {f"q0_s{d}": x for d, x in enumerate(slot_strides(strides, place["dim"], place["axes"]))}
                out["SLOT"] = strides[place["dim"]]
            return out
        return Frame(tuple(domain), lined, sizes, batch)

    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        # (`grid` sees no spec: the key-block kernels of dk and dv say so with KEYS, from `sizes`.)
        rows, block = (ints["N"], config["BLOCK_N"]) if ints.get("KEYS") else (ints["M"], config["BLOCK_M"])
        return (-(-rows // block), ints["batch"], 1)

    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        return launch.ints["K"] <= config["BLOCK_D"] and launch.ints["DV"] <= config["BLOCK_DV"]

    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        b, t, s, d, dv = ints["batch"], ints["M"], ints["N"], ints["K"], ints["DV"]
        what = role(spec)
        causal = bool(dict(spec.nodes[0].attrs).get("causal", False))
        per = {"lse": d, "q": 2 * d + dv, "k": 2 * d + dv, "v": d + dv, "kv": 2 * d + 2 * dv}[what]
        flops = 2.0 * b * t * s * per * (0.5 if causal else 1.0)
        return Problem("flash", spec.operands[0][0], flops, moved, batch=b, m=t, n=s, k=d, dv=dv,
                       causal=causal, elem_bytes=ITEMSIZE[spec.operands[0][0]])

    def shape_text(self, p: Problem) -> str:
        return f"{p.batch}x{p.m}x{p.n}x{p.k}x{p.dv}" + ("c" if p.causal else "")

    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        return True, False

    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        bd, bdv = head_block(p.k), head_block(p.dv)
        return [make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv, num_warps=w, num_stages=s)
                for bm in BLOCK_M for bn in BLOCK_N for w in WARPS for s in STAGES]

    def default_config(self, p: Problem) -> Config:
        # Whole heads up to MAX_HEAD in small score blocks: any sequence lengths.
        return make_config(BLOCK_M=32, BLOCK_N=32, BLOCK_D=max(64, head_block(p.k)),
                           BLOCK_DV=max(64, head_block(p.dv)), num_warps=4, num_stages=1)

    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        return matmul_peak(p.dtype, profile)

    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        """Like attention's forward model: each program walks its score blocks (up to the diagonal
        when causal), doing its products from shared memory; q, dO (or kT, v) through L2 for every
        block."""
        bm, bn, bd, bdv, stages = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"], c["num_stages"]
        threads = 32 * c["num_warps"]
        smem = smem_bytes(c, p.elem_bytes)
        regs = regs_per_thread(c, p.elem_bytes, _both(p)) + BASE_REGS_PER_THREAD
        per_sm = blocks_per_sm(hw, threads, regs, smem)
        keys = p.flops / max(1.0, 2.0 * p.batch * p.m * p.n * (0.5 if p.causal else 1.0))   # head widths of products
        # Programs over query blocks (lse, dq) or key blocks (dk, dv): the model sees the larger count.
        programs = p.batch * max(math.ceil(p.m / bm), math.ceil(p.n / bn))
        slots = hw.sm_count * per_sm
        steps = key_steps(p, bm, bn)
        sm_peak = top.flops / hw.sm_count
        step_flops = 2 * bm * bn * keys
        feed = smem_feed(p, {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": c["num_warps"]}, hw, sm_peak)

        def sm_seconds(resident: int) -> float:
            return steps * resident * step_flops / (sm_peak * feed) * (1.0 if stages > 1 else 1.25)

        full_waves, tail = divmod(programs, slots)
        compute = full_waves * sm_seconds(per_sm)
        if tail:
            compute += sm_seconds(math.ceil(tail / hw.sm_count))
        in_flight = max(1, stages - 1) * max(bm, bn) * (bd + bdv) * p.elem_bytes
        memory = stream_s(p.bytes, programs, per_sm, in_flight, hw, top.bandwidth)
        loaded = programs * steps * max(bm, bn) * (bd + bdv) * p.elem_bytes
        memory = max(memory, loaded / (top.bandwidth * L2_SPEEDUP))
        if regs > hw.max_registers_per_thread:
            compute *= SPILL_PENALTY
        return max(compute, memory, p.flops / top.flops)

    def tie_break(self, p: Problem, config: Config) -> tuple:
        return (-config["BLOCK_M"] * config["BLOCK_N"], config["num_stages"], config_key(config))


TEMPLATE = FlashTemplate()
