"""Tests for `xgbuild.tuner.predict`: the roofline cost model and the ranking built on it."""

from __future__ import annotations

import dataclasses

import pytest

from xgbuild.hw import Measured
from xgbuild.compiler.codegen.templates.base import config_key, make_config
from xgbuild.compiler.codegen.templates.roofline import matmul_peak
from xgbuild.tuner import predict, space
from xgbuild.tuner.predict import floor_ms, predict_ms, rank
from xgbuild.tuner.space import candidates

from .test_space import CHECKED, IDS, PROBLEMS, elementwise, matmul, profile, rowwise

GEMM = matmul(4096, 4096, 4096)


def gemm_config(bm: int, bn: int, bk: int = 64, warps: int = 8, stages: int = 3) -> dict:
    return make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, TF32X3=0, num_warps=warps,
                             num_stages=stages)


@pytest.mark.parametrize("gpu", CHECKED)
def test_small_tiles_rank_behind_large_ones(gpu):
    target = profile(gpu)
    bad = gemm_config(16, 32, warps=4)
    good = gemm_config(128, 128, warps=4)
    assert space.prune(GEMM, [bad, good], target)[0] == [bad, good]
    ranked = [config_key(c) for _, c in rank(GEMM, [bad, good], target)]
    assert ranked == [config_key(good), config_key(bad)]
    assert predict_ms(GEMM, bad, target) > 2 * predict_ms(GEMM, good, target)


def test_best_candidate_for_a_large_gemm_is_a_large_tile():
    ms, best = rank(GEMM, candidates(GEMM, profile("H100")), profile("H100"))[0]
    assert best["BLOCK_M"] * best["BLOCK_N"] >= 128 * 128
    assert ms < 1.1 * floor_ms(GEMM, profile("H100")) + predict.LAUNCH_MS


@pytest.mark.parametrize("gpu", CHECKED)
@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_prediction_never_beats_the_roofline(gpu, problem):
    target = profile(gpu)
    # Datasheet ceilings are at least the measured ones, so their floor is lower still.
    datasheet = 1e3 * problem.bytes / target.hbm_bandwidth_bytes_per_s
    for config in space.full_space(problem):
        if space.prune(problem, [config], target)[0]:
            # A 3xTF32 config's ceiling is the tensor cores' TF32 rate over three products.
            top = predict.ceilings(problem, target, config)
            floor = 1e3 * max(problem.flops / top.flops, problem.bytes / top.bandwidth)
            ms = predict_ms(problem, config, target)
            assert ms >= floor >= datasheet * (1 - 1e-12)
            assert ms >= floor_ms(problem, target, config)
            if config.get("TF32X3"):
                tf32 = matmul_peak("tf32", target)
                assert top.flops == pytest.approx(tf32 / 3) and ms >= 1e3 * problem.flops * 3 / tf32


def test_tf32x3_only_for_float32_on_tensor_core_targets_and_never_crowds_out_exact_products():
    for gpu in CHECKED:
        target = profile(gpu)
        for problem in PROBLEMS:
            cands = candidates(problem, target)
            x3 = [c for c in cands if c.get("TF32X3")]
            if problem.kind != "matmul" or problem.dtype != "float32":
                assert not x3
            else:
                assert x3 and len(cands) - len(x3) >= len(x3)


def test_measured_ceilings_are_used_when_present():
    h100 = profile("H100")
    assert predict.ceilings(GEMM, h100).flops == 742e12
    assert predict.ceilings(GEMM, h100).bandwidth == 3.00e12
    bare = dataclasses.replace(h100, measured=Measured())
    assert predict.ceilings(GEMM, bare).flops == h100.peak_flops.bf16
    assert predict.ceilings(GEMM, bare).bandwidth == h100.hbm_bandwidth_bytes_per_s
    # fp16 runs at bf16's rate on these parts, so the measured efficiency carries over.
    fp16 = dataclasses.replace(GEMM, dtype="float16")
    assert predict.ceilings(fp16, h100).flops == pytest.approx(742e12)
    # fp32 without TF32 is CUDA-core FMA.
    fp32 = matmul(4096, 4096, 4096, "float32", 4)
    assert predict.ceilings(fp32, h100).flops == h100.peak_flops.fp32


def test_launch_overhead_dominates_tiny_problems():
    tiny = matmul(16, 32, 32)
    config = space.default_config(tiny)
    assert predict.LAUNCH_MS <= predict_ms(tiny, config, profile("H100")) < 0.01


def test_looped_rows_reread_costs_more_than_one_tile():
    # 32 Ki-column fp32 rows do not stay in L1 or L2 while in progress: the looped form pays for
    # its second read, the single-tile form does not.
    problem = rowwise(4096, 32768, passes=2, dtype="float32", elem_bytes=4)
    single = make_config(BLOCK_N=32768, SINGLE=1, num_warps=16, num_stages=1)
    looped = make_config(BLOCK_N=4096, SINGLE=0, num_warps=8, num_stages=1)
    h100 = profile("H100")
    assert predict_ms(problem, looped, h100) > 1.5 * predict_ms(problem, single, h100)


def test_small_blocks_are_slower_for_streaming():
    problem = elementwise(1 << 28)
    small = make_config(BLOCK=256, num_warps=8, num_stages=1)
    large = make_config(BLOCK=4096, num_warps=4, num_stages=1)
    assert predict_ms(problem, small, profile("H100")) > predict_ms(problem, large, profile("H100"))


def test_wave_quantization():
    # Five stages of 128x128x64 take 162 KiB: one block per SM, so 132 tiles are one full wave on
    # an H100 and a 133rd runs alone in a second one while the other SMs sit idle.
    config = gemm_config(128, 128, bk=64, warps=8, stages=5)
    full = matmul(128 * 12, 128 * 11, 8192)
    over = matmul(128 * 12 + 1, 128 * 11, 8192)
    h100 = profile("H100")
    assert predict_ms(over, config, h100) > 1.8 * predict_ms(full, config, h100)


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_rank_is_deterministic_and_sorted(problem):
    target = profile("H100")
    configs = space.full_space(problem)
    configs = space.prune(problem, configs, target)[0]
    first = rank(problem, configs, target)
    again = rank(problem, list(reversed(configs)), target)
    assert first == again
    keys = [(ms, predict.tie_break(problem, c)) for ms, c in first]
    assert keys == sorted(keys)
    assert [predict_ms(problem, c, target) for _, c in first] == [ms for ms, _ in first]


def test_equal_predictions_prefer_the_measured_best_hopper_tile():
    # On an H100 (bf16 4096^3) 128x256x64 with 8 warps ran fastest; the model alone must pick it.
    target = profile("H100")
    ms, best = rank(GEMM, [c for c in candidates(GEMM, target) if not c["TF32X3"]], target)[0]
    assert (best["BLOCK_M"], best["BLOCK_N"], best["BLOCK_K"], best["num_warps"]) == (128, 256, 64, 8)


def test_candidates_come_best_first():
    target = profile("H100")
    configs = candidates(GEMM, target)
    assert configs == [c for _, c in rank(GEMM, configs, target)]


# --- what the H200 measured of predicted configs (GPT-2 small's training step, session 26) ------

def _predicted(problem, gpu: str = "H200") -> dict:
    return rank(problem, space.full_space(problem, profile(gpu)), profile(gpu))[0][1]


def test_elementwise_elements_a_thread_are_bounded_by_the_values_each_holds():
    """Before, each element cost two registers whatever it read: BLOCK 4096 over 2 warps (64
    elements a thread) was predicted for attention's head placing (3 strided operands, 5 dims)
    and ran 2.1 ms where 0.02 ms was measured possible, and 3 ms for AdamW's stacked update."""
    heads = dataclasses.replace(elementwise(8 * 1024 * 3 * 12 * 64), cols=64, live=4, index_live=8)
    adamw = dataclasses.replace(elementwise(12 * 768 * 3072), cols=3072, live=14, index_live=4)
    for p in (heads, adamw):
        c = _predicted(p)
        assert c["BLOCK"] / (32 * c["num_warps"]) <= 16, c
    # A lone dense operand is still streamed in large blocks.
    c = _predicted(dataclasses.replace(elementwise(1 << 24), live=2))
    assert c["BLOCK"] / (32 * c["num_warps"]) >= 8, c


def test_few_programs_with_long_loops_are_not_predicted_fast():
    """A looped row program issues a step's load only after reducing the last one. The column form
    over [8192, 50257] logits (64 programs of 786 steps) was predicted at 0.24 ms and ran 3.65 ms,
    the row form 0.32 ms."""
    # The job's own problem: bfloat16 logits, int64 targets (its widest input), 824 MB moved.
    logits = dataclasses.replace(rowwise(8192, 50257), flops=2.06e9, bytes=8.24e8, elem_bytes=8, columns=True)
    few = make_config(BLOCK_N=64, SINGLE=0, ROWS=128, num_warps=8, num_stages=1)
    column_ms = predict_ms(logits, few, profile("H200"))
    assert column_ms >= 786 * 1.2e-3
    rows = make_config(BLOCK_N=1024, SINGLE=0, num_warps=4, num_stages=1)
    assert predict_ms(dataclasses.replace(logits, columns=False), rows, profile("H200")) < column_ms


def test_a_row_broadcast_operand_is_not_a_strided_column():
    """A per-row value read along the reduced dim has stride 0 there: the log-sum-exp's max beside
    the logits. Taking it for a strided column charged the row form a sector per element and
    offered only the column form a fair price."""
    from xgbuild.compiler.driver import compile_source
    from xgbuild.tuner.jobs import plan
    src = ("extern Tensor[float32, T, V] X\nextern Tensor[float32, T, 1] M\ndef main() {\n"
           "    return sum(exp(X - M), dim=1)\n}\n")
    jobs, _ = plan(compile_source(src, "lse.xg").optimized.main, {"T": 256, "V": 4096})
    rows = [j for j in jobs if j.spec.kind == "rowwise"]
    assert rows and not any(j.problem.columns for j in rows)
    src = "extern Tensor[float32, T, V] X\ndef main() {\n    return sum(X, dim=0)\n}\n"
    jobs, _ = plan(compile_source(src, "cols.xg").optimized.main, {"T": 256, "V": 4096})
    assert any(j.problem.columns for j in jobs if j.spec.kind == "rowwise")
