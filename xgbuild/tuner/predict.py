"""The cost model: a deterministic roofline estimate of one config's run time on one GPU.

Owns: the ceilings a prediction uses (measured copy bandwidth and bf16 matmul rate where the
profile has them, else the datasheet's), the roofline floor, `predict_ms` and `rank`.

The model is for ordering configs and for builds with no GPU to time on, not for reporting: it
counts the bytes a config really moves (matmul operand re-reads per tile, less what GROUP_M lets
L2 serve; the looped rowwise form reading its row `passes + 1` times unless L1 or L2 hold it),
whether enough loads are in flight to reach full bandwidth, how tiles quantize into waves over the
SMs, and ~3 us per launch. Every prediction is at least `floor_ms`. Pure: no clock, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xgbuild.hw import GpuProfile
from xgbuild.tuner.space import (BASE_REGS_PER_THREAD, Config, Problem, acc_regs_per_thread,
                                 attention_regs_per_thread, attention_smem_bytes, config_key,
                                 matmul_smem_bytes, row_regs_per_thread)

LAUNCH_MS = 0.003
TENSOR_CORE_DTYPES = ("bfloat16", "float16", "float8", "float8_e4m3", "float8_e5m2")
# Latency of a global load under full load (idle latency is about half): what loads in flight
# must cover (Little's law: bytes in flight = bandwidth x latency) and what pipeline stages hide.
MEMORY_LATENCY_S = 1.2e-6
# An SM's load path sustains a few times its fair share of device bandwidth, not all of it: few
# busy SMs cannot saturate HBM however much each has in flight.
SM_BANDWIDTH_SHARE = 4.0
# Reads served by L2 or L1 instead of HBM, as multiples of HBM bandwidth (rough: an H100's L2
# streams about 12 TB/s to the SMs).
L2_SPEEDUP = 4.0
L1_SPEEDUP = 10.0
# Shared-memory bytes per clock per SM (32 banks x 4 B) on every NVIDIA GPU XG targets.
SMEM_BYTES_PER_CLOCK = 128
# mma.sync's share of the warpgroup-MMA rate on Hopper and later (an estimate).
MMA_SYNC_SHARE = 0.65
# Resident blocks per SM the hardware allows at most (compute capability 8.0-10.0).
MAX_BLOCKS_PER_SM = 32
# A register-resident tile beyond the per-thread maximum spills to local memory.
SPILL_PENALTY = 2.0
# exp() results per clock per SM (the special function units: 16 on Hopper): the softmax inside
# a fused attention kernel runs between the two products, not beside them, without warp
# specialisation.
EXP_PER_CLOCK_PER_SM = 16


@dataclass(frozen=True)
class Ceilings:
    """What the model takes as the GPU's best: bytes/s for memory, FLOP/s for the problem's math."""

    bandwidth: float
    flops: float


def _scalar_peak(dtype: str, profile: GpuProfile) -> float:
    """CUDA-core FLOP/s for element-wise math in `dtype`."""
    # Profiles carry no fp64 figure; half the fp32 rate is the datacenter parts' ratio (consumer
    # parts are far slower, which shifts every config alike and so leaves the ranking alone).
    return profile.peak_flops.fp32 / 2 if dtype == "float64" else profile.peak_flops.fp32


def _tensor_cores(dtype: str) -> bool:
    """Whether a matmul on `dtype` operands runs on tensor cores (fp32 is exact FMA unless 3xTF32)."""
    return dtype in TENSOR_CORE_DTYPES or dtype == "tf32"


def _matmul_peak(dtype: str, profile: GpuProfile) -> float:
    """FLOP/s of a large matmul in `dtype`: measured where known, else the datasheet peak."""
    if not _tensor_cores(dtype):
        return _scalar_peak(dtype, profile)
    try:
        peak = profile.peak_flops_for(dtype)
    except ValueError:  # no such tensor-core mode on this GPU (fp8 before Hopper and Ada)
        return _scalar_peak(dtype, profile)
    measured = profile.measured.bf16_matmul_flops_per_s
    if measured is None:
        return peak
    # The measured bf16 efficiency carries over to the other tensor-core modes.
    return measured * peak / profile.peak_flops.bf16


def ceilings(problem: Problem, profile: GpuProfile, config: Config | None = None) -> Ceilings:
    """The bandwidth and FLOP/s ceilings for `problem` on `profile` (under `config`: a 3xTF32
    matmul runs three TF32 tensor-core products per useful one)."""
    bandwidth = profile.measured.copy_bandwidth_bytes_per_s or profile.hbm_bandwidth_bytes_per_s
    if problem.kind == "attention":
        return Ceilings(bandwidth, _matmul_peak(problem.dtype, profile))
    if problem.kind == "matmul":
        if _tf32x3(config):
            return Ceilings(bandwidth, _matmul_peak("tf32", profile) / 3)
        return Ceilings(bandwidth, _matmul_peak(problem.dtype, profile))
    return Ceilings(bandwidth, _scalar_peak(problem.dtype, profile))


def _tf32x3(config: Config | None) -> bool:
    return bool(config and config.get("TF32X3", 0))


def floor_ms(problem: Problem, profile: GpuProfile, config: Config | None = None) -> float:
    """The roofline floor: max(flops / peak, bytes / bandwidth), in milliseconds."""
    top = ceilings(problem, profile, config)
    return 1e3 * max(problem.flops / top.flops, problem.bytes / top.bandwidth)


def _blocks_per_sm(profile: GpuProfile, threads: int, regs_per_thread: float,
                   smem_bytes: int = 0) -> int:
    """Blocks of this shape one SM holds at once, by threads, registers and shared memory."""
    regs = min(profile.max_registers_per_thread, math.ceil(regs_per_thread))
    limits = [MAX_BLOCKS_PER_SM, profile.max_threads_per_sm // threads,
              profile.registers_per_sm // (regs * threads)]
    if smem_bytes:
        limits.append(profile.max_shared_memory_per_sm_bytes // smem_bytes)
    return max(1, min(limits))


def _stream_s(nbytes: float, programs: int, per_sm: int, in_flight_per_program: float,
              profile: GpuProfile, bandwidth: float) -> float:
    """Seconds to stream `nbytes` with `programs` blocks, `per_sm` resident per SM.

    Full waves and the tail wave each get the bandwidth their loads in flight can reach.
    """
    slots = profile.sm_count * per_sm
    full_waves, tail = divmod(programs, slots)

    def rate(active: int) -> float:
        busy_sms = min(profile.sm_count, active)
        little = active * in_flight_per_program / (bandwidth * MEMORY_LATENCY_S)
        per_sm_cap = busy_sms * SM_BANDWIDTH_SHARE / profile.sm_count
        return bandwidth * min(1.0, little, per_sm_cap)

    per_program = nbytes / programs
    seconds = full_waves * slots * per_program / rate(slots) if full_waves else 0.0
    if tail:
        seconds += tail * per_program / rate(tail)
    return seconds


def _elementwise_s(p: Problem, c: Config, hw: GpuProfile, top: Ceilings) -> float:
    threads = 32 * c["num_warps"]
    per_thread = c["BLOCK"] / threads
    # Each element of the block lives in a register or two per input while loads are in flight.
    regs = BASE_REGS_PER_THREAD + 2 * per_thread
    programs = math.ceil(p.numel / c["BLOCK"])
    per_sm = _blocks_per_sm(hw, threads, regs)
    in_flight = min(c["BLOCK"], p.numel) * p.elem_bytes
    memory = _stream_s(p.bytes, programs, per_sm, in_flight, hw, top.bandwidth)
    if regs > hw.max_registers_per_thread:
        memory *= SPILL_PENALTY
    return max(memory, p.flops / top.flops)


def _rowwise_s(p: Problem, c: Config, hw: GpuProfile, top: Ceilings) -> float:
    threads = 32 * c["num_warps"]
    single = c["SINGLE"] == 1
    regs = BASE_REGS_PER_THREAD + (2 * row_regs_per_thread(c, p) if single else
                                   row_regs_per_thread(c, p))
    per_sm = _blocks_per_sm(hw, threads, regs)
    in_flight = min(c["BLOCK_N"], p.cols) * p.elem_bytes
    memory = _stream_s(p.bytes, p.rows, per_sm, in_flight, hw, top.bandwidth)
    if single and regs > hw.max_registers_per_thread:
        memory *= SPILL_PENALTY
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
    return max(memory, p.flops / top.flops)


def _matmul_ab_bytes(p: Problem, c: Config, hw: GpuProfile, slots: int) -> float:
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


def _mma_unit(c: Config, hw: GpuProfile) -> tuple[int, int, int]:
    """(units, rows, cols): the MMA issuers of a block and the accumulator tile each one owns.

    From Hopper on, with BLOCK_M >= 64, Triton issues warpgroup MMAs: one per 4 warps, at least
    64 rows each. Otherwise every warp issues mma.sync on tiles of at least 16 x 8. Units split
    the larger extent first, as Triton lays warps out.
    """
    warpgroups = hw.compute_capability[0] >= 9 and c["BLOCK_M"] >= 64 and c["num_warps"] % 4 == 0
    units, least_m = (c["num_warps"] // 4, 64) if warpgroups else (c["num_warps"], 16)
    tm, tn = c["BLOCK_M"], c["BLOCK_N"]
    for _ in range(units.bit_length() - 1):
        if tm >= tn and tm > least_m or tn <= 8:
            tm //= 2
        else:
            tn //= 2
    return units, max(tm, least_m), max(tn, 8)


def _smem_feed(p: Problem, c: Config, hw: GpuProfile, sm_peak: float) -> float:
    """The fraction of an SM's peak that shared memory can feed the config's math at.

    Every k-step each MMA issuer reads its A rows and B columns from shared memory (128 B per
    clock per SM); a small tile per issuer does few FLOPs per byte read and starves the math.
    """
    smem_rate = SMEM_BYTES_PER_CLOCK * hw.clock_boost_mhz * 1e6
    if _tensor_cores(p.dtype) or _tf32x3(c):
        units, tm, tn = _mma_unit(c, hw)
        read = units * (tm + tn) * p.elem_bytes
        feed = min(1.0, 2 * c["BLOCK_M"] * c["BLOCK_N"] / read * smem_rate / sm_peak)
        # From Hopper on, the full tensor-core rate needs warpgroup MMAs (or their successors),
        # which Triton emits only for BLOCK_M >= 64; mma.sync reaches about two thirds of it.
        if hw.compute_capability[0] >= 9 and c["BLOCK_M"] < 64:
            feed *= MMA_SYNC_SHARE
        return feed
    # CUDA-core FMA dots: each thread owns a roughly square sub-tile of `acc` accumulators and
    # reads about 2 * sqrt(acc) operands per k for its 2 * acc FLOPs.
    acc = c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"])
    return min(1.0, math.sqrt(acc) / p.elem_bytes * smem_rate / sm_peak)


def _matmul_s(p: Problem, c: Config, hw: GpuProfile, top: Ceilings) -> float:
    bm, bn, bk, stages = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_stages"]
    threads = 32 * c["num_warps"]
    smem = matmul_smem_bytes(c, p.elem_bytes)
    per_sm = _blocks_per_sm(hw, threads, acc_regs_per_thread(c, p) + BASE_REGS_PER_THREAD, smem)
    tiles = p.batch * math.ceil(p.m / bm) * math.ceil(p.n / bn)
    slots = hw.sm_count * per_sm

    sm_peak = top.flops / hw.sm_count
    step_flops = 2 * bm * bn * bk
    k_steps = math.ceil(p.k / bk)
    feed = _smem_feed(p, c, hw, sm_peak)

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

    ab = _matmul_ab_bytes(p, c, hw, slots)
    moved = p.bytes + max(0.0, ab - p.batch * (p.m + p.n) * p.k * p.elem_bytes)
    in_flight = (stages - 1) * (bm + bn) * bk * p.elem_bytes
    memory = _stream_s(moved, tiles, per_sm, in_flight, hw, top.bandwidth)
    # Every tile loads its A row panel and B column panel through L2, hit or miss.
    loaded = tiles * k_steps * bk * (bm + bn) * p.elem_bytes
    memory = max(memory, loaded / (top.bandwidth * L2_SPEEDUP))
    return max(compute, memory, p.flops / top.flops)


def attention_key_steps(p: Problem, block_m: int, block_n: int) -> float:
    """Key blocks one program visits, averaged over the query blocks (causal: up to its diagonal)."""
    m_blocks = math.ceil(p.m / block_m)
    if not p.causal:
        return float(math.ceil(p.n / block_n))
    return sum(math.ceil(min(p.n, (i + 1) * block_m) / block_n) for i in range(m_blocks)) / m_blocks


def _attention_s(p: Problem, c: Config, hw: GpuProfile, top: Ceilings) -> float:
    """Like a matmul whose k-steps are key blocks: each does q @ kT over the head dim's chunks and
    p @ v (tensor-core products fed from shared memory), plus the softmax's exps on the SFUs. K and
    V come from HBM once per batch index and through L2 for every query block."""
    bm, bn, bd, bdv, stages = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"], c["num_stages"]
    threads = 32 * c["num_warps"]
    smem = attention_smem_bytes(c, p.elem_bytes)
    regs = attention_regs_per_thread(c, p.elem_bytes) + BASE_REGS_PER_THREAD
    per_sm = _blocks_per_sm(hw, threads, regs, smem)
    programs = p.batch * math.ceil(p.m / bm) * math.ceil(p.dv / bdv)
    slots = hw.sm_count * per_sm
    steps = attention_key_steps(p, bm, bn)
    chunks = math.ceil(p.k / bd)

    sm_peak = top.flops / hw.sm_count
    step_flops = 2 * bm * bn * (chunks * bd + bdv)
    feed = _smem_feed(p, {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": c["num_warps"]}, hw, sm_peak)
    exp_s = bm * bn / (EXP_PER_CLOCK_PER_SM * hw.clock_boost_mhz * 1e6)

    def sm_seconds(resident: int) -> float:
        math_s = resident * (step_flops / (sm_peak * feed) + exp_s)
        return steps * max(math_s, MEMORY_LATENCY_S / max(1, stages - 1))

    full_waves, tail = divmod(programs, slots)
    compute = full_waves * sm_seconds(per_sm)
    if tail:
        compute += sm_seconds(math.ceil(tail / hw.sm_count))
    in_flight = max(1, stages - 1) * bn * (bd * chunks + bdv) * p.elem_bytes
    memory = _stream_s(p.bytes, programs, per_sm, in_flight, hw, top.bandwidth)
    loaded = programs * steps * bn * (bd * chunks + bdv) * p.elem_bytes
    memory = max(memory, loaded / (top.bandwidth * L2_SPEEDUP))
    if regs > hw.max_registers_per_thread:
        compute *= SPILL_PENALTY
    return max(compute, memory, p.flops / top.flops)


_MODELS = {"elementwise": _elementwise_s, "rowwise": _rowwise_s, "matmul": _matmul_s,
           "attention": _attention_s}


def predict_ms(problem: Problem, config: Config, profile: GpuProfile) -> float:
    """Predicted run time of `problem` under `config` on `profile`, in ms (>= `floor_ms`)."""
    top = ceilings(problem, profile, config)
    seconds = _MODELS[problem.kind](problem, config, profile, top)
    return max(1e3 * seconds, floor_ms(problem, profile, config)) + LAUNCH_MS


def tie_break(problem: Problem, config: Config) -> tuple:
    """How configs the model predicts equal are ordered (many large-GEMM tiles reach its roofline
    alike): for matmuls the larger tile, then a 128-byte k-slice, then fewer stages (on an H100, with
    bf16 4096^3: 128x256x64 0.182 ms, 128x256x32 0.185, 128x128x64 0.212, 128x128x32 0.245, and
    128x256x128 at 2 stages 0.270), then the config's canonical text."""
    if problem.kind == "attention":
        # Larger tiles (fewer re-reads of K and V), then fewer stages.
        return (-config["BLOCK_M"] * config["BLOCK_N"], config["num_stages"], config_key(config))
    if problem.kind != "matmul":
        return (config_key(config),)
    area = config["BLOCK_M"] * config["BLOCK_N"]
    if not (_tensor_cores(problem.dtype) or _tf32x3(config)):
        area = min(area, 128 * 128)     # CUDA-core dots ran alike from 64x64 to 128x128 (fp32 4096^3)
    return (-area, abs(config["BLOCK_K"] * problem.elem_bytes - 128), config["num_stages"], config_key(config))


def rank(problem: Problem, configs: list[Config], profile: GpuProfile
         ) -> list[tuple[float, Config]]:
    """(predicted ms, config) for each config, fastest first; ties broken by `tie_break`."""
    scored = [(predict_ms(problem, c, profile), tie_break(problem, c), c) for c in configs]
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(ms, c) for ms, _, c in scored]
