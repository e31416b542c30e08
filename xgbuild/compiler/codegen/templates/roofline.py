"""What the templates' cost models and pruning rules share: the GPU's ceilings, how blocks fill
an SM, how bytes stream, how shared memory feeds products, and the resource limits behind them.

The model is for ordering configs and for builds with no GPU to time on, not for reporting: it
counts the bytes a config really moves, whether enough loads are in flight to reach full
bandwidth, how tiles quantize into waves over the SMs. Each template's `seconds` builds on these;
`tuner/predict.py` adds the launch cost and the roofline floor. Pure: no clock, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xgbuild.hw import GpuProfile

from .base import Config, Problem

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

# Shared memory Triton uses besides the pipelined A/B tiles: mbarriers, reduction scratch and the
# epilogue's layout conversion (which mostly reuses the pipeline buffers, so a little is enough).
SMEM_HEADROOM_BYTES = 2048
# Registers a thread needs besides the accumulator or the row it holds: addresses, indices, masks.
BASE_REGS_PER_THREAD = 40
# An mma instruction covers a 16x8 accumulator tile per warp: 4 elements per thread. Fewer means
# warps duplicating work instead of sharing it.
MIN_ACC_ELEMENTS_PER_THREAD = 4


@dataclass(frozen=True)
class Ceilings:
    """What the model takes as the GPU's best: bytes/s for memory, FLOP/s for the problem's math."""

    bandwidth: float
    flops: float


def scalar_peak(dtype: str, profile: GpuProfile) -> float:
    """CUDA-core FLOP/s for element-wise math in `dtype`."""
    # Profiles carry no fp64 figure; half the fp32 rate is the datacenter parts' ratio (consumer
    # parts are far slower, which shifts every config alike and so leaves the ranking alone).
    return profile.peak_flops.fp32 / 2 if dtype == "float64" else profile.peak_flops.fp32


def tensor_cores(dtype: str) -> bool:
    """Whether a matmul on `dtype` operands runs on tensor cores (fp32 is exact FMA unless 3xTF32)."""
    return dtype in TENSOR_CORE_DTYPES or dtype == "tf32"


def matmul_peak(dtype: str, profile: GpuProfile) -> float:
    """FLOP/s of a large matmul in `dtype`: measured where known, else the datasheet peak."""
    if not tensor_cores(dtype):
        return scalar_peak(dtype, profile)
    try:
        peak = profile.peak_flops_for(dtype)
    except ValueError:  # no such tensor-core mode on this GPU (fp8 before Hopper and Ada)
        return scalar_peak(dtype, profile)
    measured = profile.measured.bf16_matmul_flops_per_s
    if measured is None:
        return peak
    # The measured bf16 efficiency carries over to the other tensor-core modes.
    return measured * peak / profile.peak_flops.bf16


def tf32x3(config: Config | None) -> bool:
    return bool(config and config.get("TF32X3", 0))


def tf32x3_rule(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    """The pruning rule of the products' `TF32X3` knob (matmul and attention): float32 operands
    on a GPU with TF32 tensor cores, in tiles of warpgroup MMAs."""
    if not tf32x3(c):
        return None
    if p.dtype != "float32":
        return f"TF32X3 applies to float32 operands, not {p.dtype}"
    if hw.peak_flops.tf32 <= 0:
        return f"{hw.name} has no TF32 tensor cores"
    if c["BLOCK_M"] < 64:
        return "TF32X3 needs BLOCK_M >= 64 (warpgroup MMAs): three products on mma.sync do not pay"
    return None


def over_smem(need: int, hw: GpuProfile) -> str | None:
    """Why a block asking for `need` bytes of shared memory cannot run on `hw`, or None."""
    if need > hw.max_shared_memory_per_block_bytes:
        return (f"shared memory {need} B > {hw.max_shared_memory_per_block_bytes} B per block "
                f"on {hw.name}")
    return None


def blocks_per_sm(profile: GpuProfile, threads: int, regs_per_thread: float,
                  smem_bytes: int = 0) -> int:
    """Blocks of this shape one SM holds at once, by threads, registers and shared memory."""
    regs = min(profile.max_registers_per_thread, math.ceil(regs_per_thread))
    limits = [MAX_BLOCKS_PER_SM, profile.max_threads_per_sm // threads,
              profile.registers_per_sm // (regs * threads)]
    if smem_bytes:
        limits.append(profile.max_shared_memory_per_sm_bytes // smem_bytes)
    return max(1, min(limits))


def stream_s(nbytes: float, programs: int, per_sm: int, in_flight_per_program: float,
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


def mma_unit(c: Config, hw: GpuProfile) -> tuple[int, int, int]:
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


def wgmma_layout(c: Config) -> tuple[int, int]:
    """(warpgroups along M, along N) of a Hopper MMA block, as Triton lays its warps out: along M
    first, 16 rows a warp, while BLOCK_M has rows left; then along N."""
    wm, wn = 4, 1
    while wm * wn < c["num_warps"]:
        if c["BLOCK_M"] > 16 * wm:
            wm *= 2
        else:
            wn *= 2
    return max(1, wm // 4), wn


def pipelined_feed(p: Problem, c: Config, hw: GpuProfile, sm_peak: float) -> float:
    """`smem_feed` of a pipelined matmul block (BLOCK_M x BLOCK_N x BLOCK_K, operand tiles copied
    into shared memory each k-step) on Hopper's warpgroup MMAs; other GPUs and configs: `smem_feed`.

    Each warpgroup owns (BLOCK_M / along-M) x (BLOCK_N / along-N) of the accumulator and covers it
    with m64 x nN x k16 instructions (N at most 256), each reading its 64 A rows and N B columns
    from shared memory: a block of 256 rows re-reads B four times. The copies of the A and B tiles
    into shared memory share its bandwidth. On an H200 the model then orders the large bf16 tiles
    as measured (128x256 before 256x128 before 128x128 before 256x64: 1.10, 1.26, 1.30, 1.70 ms
    for the MLP's GELU GEMM), where counting reads alone priced them all at the roofline."""
    wgmma = hw.compute_capability[0] >= 9 and c["BLOCK_M"] >= 64 and c["num_warps"] % 4 == 0
    if not wgmma or not (tensor_cores(p.dtype) or tf32x3(c)):
        return smem_feed(p, c, hw, sm_peak)
    gm, gn = wgmma_layout(c)
    tm, tn = c["BLOCK_M"] // gm, max(8, c["BLOCK_N"] // gn)
    width = min(tn, 256)
    instructions = max(1, tm // 64) * math.ceil(tn / width)
    read = gm * gn * instructions * (64 + width)        # elements per k, by every warpgroup
    copied = c["BLOCK_M"] + c["BLOCK_N"]                 # the tiles' copy into shared memory, per k
    smem_rate = SMEM_BYTES_PER_CLOCK * hw.clock_boost_mhz * 1e6
    return min(1.0, 2 * c["BLOCK_M"] * c["BLOCK_N"] / ((read + copied) * p.elem_bytes) * smem_rate / sm_peak)


def smem_feed(p: Problem, c: Config, hw: GpuProfile, sm_peak: float) -> float:
    """The fraction of an SM's peak that shared memory can feed the config's math at.

    Every k-step each MMA issuer reads its A rows and B columns from shared memory (128 B per
    clock per SM); a small tile per issuer does few FLOPs per byte read and starves the math.
    """
    smem_rate = SMEM_BYTES_PER_CLOCK * hw.clock_boost_mhz * 1e6
    if tensor_cores(p.dtype) or tf32x3(c):
        units, tm, tn = mma_unit(c, hw)
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
