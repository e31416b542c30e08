"""Tuning search spaces: what a kernel's launch configs may be, pruned by the target GPU.

Owns: the `Problem` a kernel solves (its kind, dtype and sizes), the full config space of each
kernel kind, the rules that drop configs the target cannot run or that cannot pay off for the
problem (each drop with a reason), the safe default config of the generic fallback kernel, and
the canonical text of a config that cache keys embed.

Configs that cannot fit the chip (shared memory, registers) are dropped here, before anything is
compiled: Inductor compiles them and fails with "out of resource: shared memory" (PERF.md). Which
of the survivors are worth timing is the cost model's call (`predict.rank`), so `candidates`
returns them best-predicted first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterable

from xgbuild.hw import GpuProfile

Config = dict[str, int]  # keys sorted; always includes num_warps and num_stages

KINDS = ("elementwise", "rowwise", "matmul", "attention")

# The parameters each kind's kernel template takes, besides num_warps and num_stages.
PARAMS = {
    "elementwise": ("BLOCK",),
    "rowwise": ("BLOCK_N", "SINGLE"),
    "matmul": ("BLOCK_K", "BLOCK_M", "BLOCK_N", "GROUP_M", "TF32X3"),
    "attention": ("BLOCK_D", "BLOCK_DV", "BLOCK_M", "BLOCK_N"),
}

# Search-space axes.
ELEMENTWISE_BLOCKS = (256, 512, 1024, 2048, 4096, 8192)
ELEMENTWISE_WARPS = (2, 4, 8)
ROW_SINGLE_WARPS = (1, 2, 4, 8, 16)
ROW_LOOP_BLOCKS = (256, 512, 1024, 2048, 4096)
ROW_LOOP_WARPS = (2, 4, 8)
ROW_SINGLE_MAX_COLS = 32768
MATMUL_BLOCK_M = (16, 32, 64, 128, 256)
MATMUL_BLOCK_N = (32, 64, 128, 256)
MATMUL_BLOCK_K = (32, 64, 128)
MATMUL_GROUP_M = 8
MATMUL_WARPS = (4, 8)
MATMUL_STAGES = (2, 3, 4, 5)
ATTENTION_BLOCK_M = (16, 32, 64, 128)
ATTENTION_BLOCK_N = (16, 32, 64, 128)
ATTENTION_WARPS = (4, 8)
ATTENTION_STAGES = (1, 2, 3, 4)
# The head dim is one tile up to this (q's rows loaded once); wider heads loop over D in chunks of
# half of it, and wider v heads are split over programs.
ATTENTION_MAX_HEAD = 256

# How many configs `candidates` returns at most, per kind; matmul is the only one that needs a cut.
MAX_CANDIDATES = {"elementwise": 48, "rowwise": 48, "matmul": 48, "attention": 48}
# Matmul configs sharing one (BLOCK_M, BLOCK_N) tile taken before the rest by rank: the cost model
# is coarse about stages and warps, so the timed set should span tile shapes, not one shape's
# variants.
PER_TILE_SHAPE = 4

# Shared memory Triton uses besides the pipelined A/B tiles: mbarriers, reduction scratch and the
# epilogue's layout conversion (which mostly reuses the pipeline buffers, so a little is enough).
SMEM_HEADROOM_BYTES = 2048
# An fp32 accumulator tile spread over the block's threads; more than this spills on every GPU XG
# targets, whatever the per-thread maximum, once operand fragments and addresses are counted.
MAX_ACC_REGS_PER_THREAD = 128
# Registers a thread needs besides the accumulator or the row it holds: addresses, indices, masks.
BASE_REGS_PER_THREAD = 40
# A k-slice of a tile row is at most this many bytes: 64 bf16, 32 fp32 elements (one 128-byte line,
# the widest shared-memory swizzle), and never fewer than the smallest BLOCK_K (32, for fp64). On an H100 every bf16 tile ran slower with
# 256-byte slices (128x256x128 at 2 stages 0.270 ms against 0.182 at BLOCK_K 64, bf16 4096^3), and
# for fp32/fp64 (CUDA-core FMA dots) operand fragments in registers grow with BLOCK_K.
MAX_K_SLICE_BYTES = 128
# Elementwise: elements per thread beyond this hold too many registers per input.
MAX_ELEMENTS_PER_THREAD = 64
# An mma instruction covers a 16x8 accumulator tile per warp: 4 elements per thread. Fewer means
# warps duplicating work instead of sharing it.
MIN_ACC_ELEMENTS_PER_THREAD = 4
# A fused attention kernel on CUDA-core FMA products (float32 and float64 operands: no tensor cores)
# holds its score tile, the output accumulator and both products' operand fragments in registers.
# On an H100 (fp32, 8x12 heads of 512x64, every candidate measured) each config with at most 16
# score elements per thread ran in 0.35-0.81 ms, while 32 or more ran 3.5-13.5 ms in 13 of 20
# cases (spills): 128x128 over 8 warps, the model's pick, took 12.8 ms against 0.35 for 32x64/4.
MAX_FMA_SCORES_PER_THREAD = 16


@dataclass(frozen=True)
class Problem:
    """One kernel's work: its kind, operand dtype and sizes, its useful FLOPs and fewest bytes."""

    kind: str            # "elementwise" | "rowwise" | "matmul"
    dtype: str           # XG dtype of the operands / widest input: "bfloat16", "int32", ...
    flops: float         # useful floating-point operations
    bytes: float         # fewest bytes: every input read once, every output written once
    numel: int = 0       # elementwise: elements of the domain
    rows: int = 0        # rowwise: number of rows
    cols: int = 0        # rowwise: reduced length of each row
    passes: int = 1      # rowwise: reductions needing the whole row before the next
    batch: int = 1       # matmul, attention (m = T queries, n = S keys, k = D head dim)
    m: int = 0
    n: int = 0
    k: int = 0
    dv: int = 0          # attention: v's head dim (the output's last)
    causal: bool = False  # attention: key blocks above the diagonal are skipped
    elem_bytes: int = 4  # bytes per element of the operands (matmul A/B) or of the widest input

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kernel kind {self.kind!r}; "
                             f"expected one of {', '.join(KINDS)}")
        if not self.dtype:
            raise ValueError("problem dtype must not be empty")
        if self.elem_bytes not in (1, 2, 4, 8):
            raise ValueError(f"elem_bytes must be 1, 2, 4 or 8, got {self.elem_bytes}")
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"flops and bytes must be >= 0, got {self.flops} and {self.bytes}")
        sizes = {"elementwise": ("numel",), "rowwise": ("rows", "cols", "passes"),
                 "matmul": ("batch", "m", "n", "k"), "attention": ("batch", "m", "n", "k", "dv")}[self.kind]
        for name in sizes:
            if getattr(self, name) < 1:
                raise ValueError(f"{self.kind} problem needs {name} >= 1, "
                                 f"got {getattr(self, name)}")


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def config_key(config: Config) -> str:
    """Canonical JSON text of a config: sorted keys, no spaces."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def make_config(**params: int) -> Config:
    """A config dict with its keys sorted."""
    return dict(sorted(params.items()))


def default_config(problem: Problem) -> Config:
    """A config valid for any size on every target: the generic fallback kernel's."""
    if problem.kind == "elementwise":
        return make_config(BLOCK=1024, num_warps=4, num_stages=1)
    if problem.kind == "rowwise":
        return make_config(BLOCK_N=1024, SINGLE=0, num_warps=4, num_stages=1)
    if problem.kind == "attention":
        # Loops over D in chunks of 64 and splits v's columns by 64 over programs: any sizes.
        return make_config(BLOCK_M=64, BLOCK_N=32, BLOCK_D=64, BLOCK_DV=64, num_warps=4, num_stages=2)
    # 64x64 tiles fit 99 KiB parts even for fp64 at 2 stages; BLOCK_K respects the k-slice rule.
    block_k = max(MATMUL_BLOCK_K[0], min(64, MAX_K_SLICE_BYTES // problem.elem_bytes))
    stages = 3 if problem.elem_bytes <= 4 else 2
    return make_config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=block_k, GROUP_M=MATMUL_GROUP_M, TF32X3=0,
                       num_warps=4, num_stages=stages)


def full_space(problem: Problem) -> list[Config]:
    """Every config of the problem's kind before pruning, in a fixed order."""
    if problem.kind == "elementwise":
        return [make_config(BLOCK=b, num_warps=w, num_stages=1)
                for b in ELEMENTWISE_BLOCKS for w in ELEMENTWISE_WARPS]
    if problem.kind == "rowwise":
        single = [make_config(BLOCK_N=next_pow2(problem.cols), SINGLE=1, num_warps=w, num_stages=1)
                  for w in ROW_SINGLE_WARPS]
        looped = [make_config(BLOCK_N=b, SINGLE=0, num_warps=w, num_stages=1)
                  for b in ROW_LOOP_BLOCKS for w in ROW_LOOP_WARPS]
        return single + looped
    if problem.kind == "attention":
        bd, bdv = attention_head_blocks(problem)
        return [make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv, num_warps=w, num_stages=s)
                for bm in ATTENTION_BLOCK_M for bn in ATTENTION_BLOCK_N for w in ATTENTION_WARPS
                for s in ATTENTION_STAGES]
    # float32 products: exact FMA (TF32X3=0) or three TF32 tensor-core products (see
    # `_matmul_tf32x3` and the tuner's gate, which admits them only as accurate as float32's own).
    x3s = (0, 1) if problem.dtype == "float32" else (0,)
    return [make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=MATMUL_GROUP_M, TF32X3=x3,
                        num_warps=w, num_stages=s)
            for x3 in x3s for bm in MATMUL_BLOCK_M for bn in MATMUL_BLOCK_N for bk in MATMUL_BLOCK_K
            for w in MATMUL_WARPS for s in MATMUL_STAGES]


def attention_head_blocks(problem: Problem) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DV): the whole head dims (at least 16, tl.dot's least) up to
    ATTENTION_MAX_HEAD, else half of that per chunk."""
    def block(size: int) -> int:
        full = max(16, next_pow2(size))
        return full if full <= ATTENTION_MAX_HEAD else ATTENTION_MAX_HEAD // 2
    return block(problem.k), block(problem.dv)


# --- resources a config needs (shared with the cost model) ---------------------------------------


def matmul_smem_bytes(config: Config, elem_bytes: int) -> int:
    """Shared memory one matmul block asks for: the pipelined A and B tiles plus headroom."""
    tile = config["BLOCK_M"] * config["BLOCK_K"] + config["BLOCK_K"] * config["BLOCK_N"]
    return tile * elem_bytes * config["num_stages"] + SMEM_HEADROOM_BYTES


def attention_smem_bytes(config: Config, elem_bytes: int) -> int:
    """Shared memory one attention block asks for: q's tile, the pipelined k and v tiles, the
    probabilities on their way to the second product, and headroom."""
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    kv = bn * (config["BLOCK_D"] + config["BLOCK_DV"]) * config["num_stages"]
    return (bm * config["BLOCK_D"] + kv + bm * bn) * elem_bytes + SMEM_HEADROOM_BYTES


def attention_regs_per_thread(config: Config, elem_bytes: int = 2) -> float:
    """32-bit registers per thread for the output accumulator and the score tile (fp32), the
    probabilities (counted at half: 16-bit operands of the second product, or reusing the scores),
    and q's tile, which the tuned (`single`) variant keeps live across the key loop."""
    bm = config["BLOCK_M"]
    q_tile = bm * config["BLOCK_D"] * elem_bytes / 4
    return (bm * (config["BLOCK_DV"] + 1.5 * config["BLOCK_N"]) + q_tile) / (32 * config["num_warps"])


def acc_regs_per_thread(config: Config, problem: Problem) -> float:
    """32-bit registers per thread holding the accumulator (fp64 accumulators take two)."""
    per_elem = 2 if problem.dtype == "float64" else 1
    threads = 32 * config["num_warps"]
    return config["BLOCK_M"] * config["BLOCK_N"] * per_elem / threads


def row_regs_per_thread(config: Config, problem: Problem) -> float:
    """32-bit registers per thread holding its share of one row tile (fp32, fp64 takes two)."""
    per_elem = 2 if problem.dtype == "float64" else 1
    return config["BLOCK_N"] * per_elem / (32 * config["num_warps"])


def row_regs_limit(profile: GpuProfile) -> int:
    """Registers per thread a whole-row tile may take, leaving the rest for the math on it."""
    return min(64, profile.max_registers_per_thread // 2)


# --- pruning rules: each returns why a config is dropped, or None ---------------------------------

Rule = Callable[[Problem, Config, GpuProfile], "str | None"]


def _elementwise_block_vs_numel(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    # Keep one block size that covers the whole domain; larger ones only mask more lanes off.
    cover = max(ELEMENTWISE_BLOCKS[0], next_pow2(p.numel))
    if c["BLOCK"] > cover:
        return f"BLOCK {c['BLOCK']} > {cover}, the smallest block covering numel {p.numel}"
    return None


def _elementwise_per_thread(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    per_thread = c["BLOCK"] / (32 * c["num_warps"])
    if per_thread > MAX_ELEMENTS_PER_THREAD:
        return (f"BLOCK {c['BLOCK']} over {c['num_warps']} warps is {per_thread:g} elements per "
                f"thread > {MAX_ELEMENTS_PER_THREAD}")
    if per_thread < 1:
        return (f"BLOCK {c['BLOCK']} leaves {per_thread:g} elements per thread "
                f"of {c['num_warps']} warps")
    return None


def _row_single_fits(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    if c["SINGLE"] == 1 and p.cols > ROW_SINGLE_MAX_COLS:
        return f"SINGLE=1 needs cols <= {ROW_SINGLE_MAX_COLS}, got cols {p.cols}"
    if c["SINGLE"] == 1 and c["BLOCK_N"] < p.cols:
        return f"SINGLE=1 needs BLOCK_N >= cols, got BLOCK_N {c['BLOCK_N']} < cols {p.cols}"
    return None


def _row_loop_block(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    cover = next_pow2(p.cols)
    if c["SINGLE"] == 0 and c["BLOCK_N"] > cover:
        return f"looped BLOCK_N {c['BLOCK_N']} > {cover} = next_pow2(cols {p.cols})"
    return None


def _row_threads(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    per_thread = c["BLOCK_N"] / (32 * c["num_warps"])
    # One warp is the least a row can get, even when the row is shorter than 32.
    if per_thread < 1 and c["num_warps"] > 1:
        return (f"{c['num_warps']} warps leave {per_thread:g} elements per thread of "
                f"BLOCK_N {c['BLOCK_N']}")
    regs, limit = row_regs_per_thread(c, p), row_regs_limit(hw)
    if c["SINGLE"] == 1 and regs > limit:
        return (f"the row tile takes {regs:g} registers per thread over {c['num_warps']} warps "
                f"> {limit} on {hw.name}")
    return None


def _matmul_tile_vs_problem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    for param, size, least in (("BLOCK_M", p.m, 16), ("BLOCK_N", p.n, 32), ("BLOCK_K", p.k, 32)):
        cover = max(least, next_pow2(size))
        if c[param] > cover:
            return f"{param} {c[param]} > {cover}, the most a size of {size} needs"
    return None


def _matmul_k_slice(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    limit = max(MATMUL_BLOCK_K[0], MAX_K_SLICE_BYTES // p.elem_bytes)
    if c["BLOCK_K"] > limit:
        return f"BLOCK_K {c['BLOCK_K']} > {limit} for {p.elem_bytes}-byte {p.dtype} operands"
    return None


def _over_smem(need: int, hw: GpuProfile) -> str | None:
    if need > hw.max_shared_memory_per_block_bytes:
        return (f"shared memory {need} B > {hw.max_shared_memory_per_block_bytes} B per block "
                f"on {hw.name}")
    return None


def _matmul_smem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    return _over_smem(matmul_smem_bytes(c, p.elem_bytes), hw)


def _matmul_regs(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    acc = acc_regs_per_thread(c, p)
    limit = min(MAX_ACC_REGS_PER_THREAD, hw.max_registers_per_thread - BASE_REGS_PER_THREAD)
    if acc > limit:
        return (f"accumulator takes {acc:g} registers per thread > {limit} "
                f"({c['BLOCK_M']}x{c['BLOCK_N']} over {c['num_warps']} warps)")
    if acc < MIN_ACC_ELEMENTS_PER_THREAD:
        return (f"a {c['BLOCK_M']}x{c['BLOCK_N']} tile over {c['num_warps']} warps is {acc:g} "
                f"accumulator elements per thread < {MIN_ACC_ELEMENTS_PER_THREAD}")
    return None


def _matmul_tf32x3(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    if not c["TF32X3"]:
        return None
    if p.dtype != "float32":
        return f"TF32X3 applies to float32 operands, not {p.dtype}"
    if hw.peak_flops.tf32 <= 0:
        return f"{hw.name} has no TF32 tensor cores"
    if c["BLOCK_M"] < 64:
        return "TF32X3 needs BLOCK_M >= 64 (warpgroup MMAs): three products on mma.sync do not pay"
    return None


def _attention_tile_vs_problem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    for param, size in (("BLOCK_M", p.m), ("BLOCK_N", p.n)):
        cover = max(16, next_pow2(size))
        if c[param] > cover:
            return f"{param} {c[param]} > {cover}, the most a size of {size} needs"
    return None


def _attention_smem(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    return _over_smem(attention_smem_bytes(c, p.elem_bytes), hw)


def _attention_regs(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    regs = attention_regs_per_thread(c, p.elem_bytes)
    limit = hw.max_registers_per_thread - BASE_REGS_PER_THREAD
    if regs > limit:
        return (f"accumulator and scores take {regs:g} registers per thread > {limit} "
                f"({c['BLOCK_M']}x{c['BLOCK_N']}, v head {c['BLOCK_DV']}, over {c['num_warps']} warps)")
    if c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"]) < MIN_ACC_ELEMENTS_PER_THREAD:
        return (f"a {c['BLOCK_M']}x{c['BLOCK_N']} score tile over {c['num_warps']} warps is fewer than "
                f"{MIN_ACC_ELEMENTS_PER_THREAD} elements per thread")
    return None


def _attention_fma_scores(p: Problem, c: Config, hw: GpuProfile) -> str | None:
    if p.dtype not in ("float32", "float64"):
        return None
    per_thread = c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"])
    if per_thread > MAX_FMA_SCORES_PER_THREAD:
        return (f"{p.dtype} products run on CUDA cores: a {c['BLOCK_M']}x{c['BLOCK_N']} score tile over "
                f"{c['num_warps']} warps is {per_thread:g} elements per thread > {MAX_FMA_SCORES_PER_THREAD} "
                "(register spills)")
    return None


RULES: dict[str, tuple[Rule, ...]] = {
    "elementwise": (_elementwise_block_vs_numel, _elementwise_per_thread),
    "rowwise": (_row_single_fits, _row_loop_block, _row_threads),
    "matmul": (_matmul_tf32x3, _matmul_tile_vs_problem, _matmul_k_slice, _matmul_smem, _matmul_regs),
    "attention": (_attention_tile_vs_problem, _attention_smem, _attention_regs, _attention_fma_scores),
}


def _check_keys(problem: Problem, config: Config) -> None:
    want = set(PARAMS[problem.kind]) | {"num_warps", "num_stages"}
    if set(config) != want:
        raise ValueError(f"a {problem.kind} config needs exactly the keys {sorted(want)}, "
                         f"got {config_key(config)}")


def prune(problem: Problem, configs: Iterable[Config], profile: GpuProfile, *,
          limit: int | None = None) -> tuple[list[Config], list[tuple[Config, str]]]:
    """Split `configs` into (kept, [(dropped, reason)]), by the rules of the problem's kind.

    With `limit`, only the `limit` best survivors by predicted time are kept (spread over tile
    shapes for matmul), and kept comes back best-predicted first; without it, in input order.
    """
    kept: list[Config] = []
    dropped: list[tuple[Config, str]] = []
    for config in configs:
        _check_keys(problem, config)
        reason = next((r for rule in RULES[problem.kind] if (r := rule(problem, config, profile))),
                      None)
        if reason is None:
            kept.append(config)
        else:
            dropped.append((config, reason))
    if limit is not None:
        kept, cut = _best(problem, kept, profile, limit)
        dropped += cut
    return kept, dropped


def _best(problem: Problem, configs: list[Config], profile: GpuProfile, limit: int, split: bool = True
          ) -> tuple[list[Config], list[tuple[Config, str]]]:
    """The `limit` best configs by predicted time, best first, and the rest with a reason."""
    from xgbuild.tuner.predict import rank  # predict imports this module for Problem

    ranked = [config for _, config in rank(problem, configs, profile)]
    chosen: set[str] = set()
    if split and problem.kind == "matmul" and any(c["TF32X3"] for c in ranked):
        # Exact-product configs keep half the slots: the tuner's gate may reject every 3xTF32 one
        # (short K, where float32's own error is tiny), and a job must still get a winner.
        half = limit // 2
        exact, _ = _best(problem, [c for c in configs if not c["TF32X3"]], profile, limit - half, False)
        x3, _ = _best(problem, [c for c in configs if c["TF32X3"]], profile, half, False)
        chosen = {config_key(c) for c in exact + x3}
        limit = len(chosen)
    if problem.kind == "matmul" and not chosen:
        per_shape: dict[tuple[int, int], int] = {}
        for config in ranked:
            shape = (config["BLOCK_M"], config["BLOCK_N"])
            if len(chosen) < limit and per_shape.get(shape, 0) < PER_TILE_SHAPE:
                per_shape[shape] = per_shape.get(shape, 0) + 1
                chosen.add(config_key(config))
    for config in ranked:
        if len(chosen) < limit:
            chosen.add(config_key(config))
    kept = [c for c in ranked if config_key(c) in chosen]
    cut = [(c, f"predicted rank {i + 1} of {len(ranked)}: outside the best {limit} kept")
           for i, c in enumerate(ranked) if config_key(c) not in chosen]
    return kept, cut


def candidates(problem: Problem, profile: GpuProfile) -> list[Config]:
    """The pruned search space for `problem` on `profile`, best-predicted first (deterministic)."""
    kept, _ = prune(problem, full_space(problem), profile, limit=MAX_CANDIDATES[problem.kind])
    return kept
