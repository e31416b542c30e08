"""Tests for `xgbuild.tuner.space`: search spaces, pruning by the GPU profile, default configs."""

from __future__ import annotations

import json

import pytest

from xgbuild import hw
from xgbuild.settings import REPO_ROOT
from xgbuild.compiler.codegen.templates import for_problem, template
from xgbuild.compiler.codegen.templates import matmul as matmul_template
from xgbuild.compiler.codegen.templates.base import Problem, config_key, make_config, next_pow2
from xgbuild.tuner import space
from xgbuild.tuner.space import candidates, default_config, prune

HW_DIR = REPO_ROOT / "hw"
CHECKED = ("H100", "A100", "RTX4090", "B200")


def profile(name: str) -> hw.GpuProfile:
    return hw.load_profile(name, HW_DIR)


def matmul(m: int, n: int, k: int, dtype: str = "bfloat16", elem_bytes: int = 2,
           batch: int = 1, b_transposed: bool = False) -> Problem:
    return Problem("matmul", dtype, flops=2.0 * batch * m * n * k,
                   bytes=float(batch * (m * k + k * n + m * n) * elem_bytes),
                   batch=batch, m=m, n=n, k=k, elem_bytes=elem_bytes, b_transposed=b_transposed)


def rowwise(rows: int, cols: int, passes: int = 1, dtype: str = "bfloat16",
            elem_bytes: int = 2) -> Problem:
    return Problem("rowwise", dtype, flops=4.0 * rows * cols, bytes=2.0 * rows * cols * elem_bytes,
                   rows=rows, cols=cols, passes=passes, elem_bytes=elem_bytes)


def elementwise(numel: int, dtype: str = "bfloat16", elem_bytes: int = 2) -> Problem:
    return Problem("elementwise", dtype, flops=float(numel), bytes=3.0 * numel * elem_bytes,
                   numel=numel, elem_bytes=elem_bytes)


PROBLEMS = [
    matmul(4096, 4096, 4096),
    matmul(16, 8192, 8192),
    matmul(8192, 11008, 4096),
    matmul(4096, 4096, 4096, "float32", 4),
    matmul(512, 512, 512, "float64", 8),
    matmul(100, 300, 70, batch=4),
    rowwise(16384, 4096),
    rowwise(8192, 8192, passes=2),
    rowwise(64, 100_000, passes=2),
    rowwise(100_000, 20),
    elementwise(1000),
    elementwise(1 << 28, "float32", 4),
]
IDS = [f"{p.kind}-{p.dtype}-{p.m or p.rows or p.numel}" for p in PROBLEMS]


# --- every candidate runs on the chip ------------------------------------------------------------


@pytest.mark.parametrize("gpu", CHECKED)
@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_candidates_fit_the_profile(gpu, problem):
    target = profile(gpu)
    configs = candidates(problem, target)
    assert configs, "every problem has at least one candidate"
    plain = [c for c in configs if not c.get("PROGRAMS")]
    assert len(plain) <= template(problem.kind).max_candidates
    assert len(configs) - len(plain) <= template(problem.kind).max_candidates
    for config in configs:
        assert list(config) == sorted(config)
        assert {"num_warps", "num_stages"} <= set(config)
        if problem.kind == "matmul":
            assert matmul_template.smem_bytes(config, problem.elem_bytes) \
                <= target.max_shared_memory_per_block_bytes
            assert matmul_template.acc_regs_per_thread(config, problem) <= 128
        if problem.kind == "rowwise" and config["SINGLE"] == 1:
            assert config["BLOCK_N"] >= problem.cols
        assert 32 * config["num_warps"] <= 1024


@pytest.mark.parametrize("gpu", CHECKED)
def test_matmul_candidates_are_a_fraction_of_the_space(gpu):
    problem = matmul(4096, 4096, 4096)
    assert len(space.full_space(problem)) == 480
    assert len(space.full_space(problem, profile(gpu))) == 960      # each with its persistent twin
    assert len([c for c in candidates(problem, profile(gpu)) if "PROGRAMS" not in c]) == 48
    linear = matmul(4096, 4096, 4096, b_transposed=True)
    assert len(space.full_space(linear, profile(gpu))) == 960
    assert len({config_key(c) for c in candidates(linear, profile(gpu))}) == 96
    single = matmul(4096, 4096, 4096, "float32", 4)
    configs = candidates(single, profile(gpu))      # no twins for float32 products
    assert len(configs) == 48 and len({config_key(c) for c in configs}) == 48


@pytest.mark.parametrize("gpu", CHECKED)
def test_persistent_twins_never_displace_the_plain_candidates(gpu):
    """The plain configs kept are those kept without twins, and each twin runs one program per SM
    with tensor descriptors; float32 products get no twins, 16-bit ones stored either way do."""
    target = profile(gpu)
    problem = matmul(4096, 3072, 768, b_transposed=True)
    configs = candidates(problem, target)
    plain = [c for c in configs if "PROGRAMS" not in c]
    alone, _ = space.prune(problem, space.full_space(problem), target, limit=48)
    assert [config_key(c) for c in plain] == [config_key(c) for c in alone]
    twins = [c for c in configs if "PROGRAMS" in c]
    assert twins and all(c["PROGRAMS"] == target.sm_count and c["TMA"] == 1 for c in twins)
    assert not any("PROGRAMS" in c for c in candidates(matmul(4096, 3072, 768, "float32", 4, b_transposed=True),
                                                       target))
    assert any("PROGRAMS" in c for c in candidates(matmul(4096, 3072, 768), target))


def test_a_config_carries_an_optional_knob_only_when_it_is_not_0():
    problem = matmul(256, 256, 256)
    base = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, TF32X3=0, num_warps=4, num_stages=3)
    assert space.prune(problem, [base, {**base, "PROGRAMS": 132, "TMA": 1}], profile("H100"))[0]
    with pytest.raises(ValueError, match="when not 0"):
        space.prune(problem, [{**base, "PROGRAMS": 0}], profile("H100"))
    with pytest.raises(ValueError, match="exactly the keys"):
        space.prune(problem, [{**base, "SPLIT_K": 2}], profile("H100"))


def test_smem_overflow_is_dropped_with_a_reason():
    problem = matmul(4096, 4096, 4096)
    big = make_config(BLOCK_M=256, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, TF32X3=0, num_warps=8,
                            num_stages=5)
    kept, dropped = prune(problem, [big], profile("H100"))
    assert kept == []
    [(config, reason)] = dropped
    assert config == big
    assert reason == "shared memory 329728 B > 232448 B per block on H100"


def test_smem_limit_depends_on_the_profile():
    # 128x128x64 bf16 over 4 stages: 128 KiB + headroom; fits Hopper's 227 KiB, not Ada's 99 KiB.
    config = make_config(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, TF32X3=0, num_warps=8,
                               num_stages=4)
    problem = matmul(4096, 4096, 4096)
    assert prune(problem, [config], profile("H100"))[0] == [config]
    kept, [(_, reason)] = prune(problem, [config], profile("RTX4090"))
    assert kept == [] and reason.startswith("shared memory") and "on RTX4090" in reason


def test_every_drop_has_a_reason():
    for problem in PROBLEMS:
        _, dropped = prune(problem, space.full_space(problem), profile("H100"), limit=48)
        assert all(isinstance(reason, str) and reason for _, reason in dropped)


def test_limit_cut_is_reported():
    problem = matmul(4096, 4096, 4096)
    full = space.full_space(problem)
    kept, dropped = prune(problem, full, profile("H100"), limit=48)
    assert len(kept) + len(dropped) == len(full)
    assert any("outside the best 48" in reason for _, reason in dropped)


def test_register_and_tile_rules():
    problem = matmul(4096, 4096, 4096)
    too_many_regs = make_config(BLOCK_M=256, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, TF32X3=0,
                                      num_warps=4, num_stages=2)
    _, [(_, reason)] = prune(problem, [too_many_regs], profile("H100"))
    assert reason.startswith("accumulator takes 256 registers per thread")

    small = matmul(8, 20, 16)
    wide = make_config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, TF32X3=0, num_warps=4,
                             num_stages=2)
    _, [(_, reason)] = prune(small, [wide], profile("H100"))
    assert reason == "BLOCK_M 32 > 16, the most a size of 8 needs"


def test_wide_operands_get_a_smaller_block_k():
    for problem, most in ((matmul(4096, 4096, 4096), 64), (matmul(4096, 4096, 4096, "float32", 4), 32),
                          (matmul(4096, 4096, 4096, "float64", 8), 32)):
        assert max(c["BLOCK_K"] for c in candidates(problem, profile("H100"))) <= most


def test_elementwise_keeps_one_block_covering_the_domain():
    configs = candidates(elementwise(1000), profile("H100"))
    assert {c["BLOCK"] for c in configs} == {256, 512, 1024}
    tiny = candidates(elementwise(3), profile("H100"))
    assert {c["BLOCK"] for c in tiny} == {256}
    assert all(c["num_stages"] == 1 for c in configs)


def test_rowwise_single_and_looped_forms():
    configs = candidates(rowwise(8192, 3000), profile("H100"))
    single = [c for c in configs if c["SINGLE"] == 1]
    looped = [c for c in configs if c["SINGLE"] == 0]
    assert {c["BLOCK_N"] for c in single} == {4096}
    assert {c["BLOCK_N"] for c in looped} <= {256, 512, 1024, 2048, 4096}
    assert looped and single
    # Too long to hold in one tile: only the looped form.
    long_rows = candidates(rowwise(64, 100_000), profile("H100"))
    assert long_rows and all(c["SINGLE"] == 0 for c in long_rows)
    _, dropped = prune(rowwise(64, 100_000), space.full_space(rowwise(64, 100_000)),
                       profile("H100"))
    assert any(r == "SINGLE=1 needs cols <= 32768, got cols 100000" for _, r in dropped)
    # Short rows: no warp left without an element, but one warp always allowed.
    short = candidates(rowwise(1000, 20), profile("H100"))
    assert [c["num_warps"] for c in short] == [1]


# --- determinism, defaults, keys ---------------------------------------------------------------


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_candidates_are_deterministic(problem):
    assert candidates(problem, profile("H100")) == candidates(problem, profile("H100"))
    first = prune(problem, space.full_space(problem), profile("A100"), limit=10)
    assert first == prune(problem, space.full_space(problem), profile("A100"), limit=10)


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
@pytest.mark.parametrize("gpu", CHECKED)
def test_default_config_is_valid_on_every_target(problem, gpu):
    config = default_config(problem)
    assert list(config) == sorted(config)
    if problem.kind == "rowwise":
        assert config["SINGLE"] == 0
    # Valid for any size: it passes the hardware rules for a large problem of its kind and dtype.
    large = {"matmul": matmul(8192, 8192, 8192, problem.dtype, problem.elem_bytes),
             "rowwise": rowwise(8192, 8192, 2, problem.dtype, problem.elem_bytes),
             "elementwise": elementwise(1 << 24, problem.dtype, problem.elem_bytes)}[problem.kind]
    kept, dropped = prune(large, [config], profile(gpu))
    assert kept == [config], dropped


def test_default_config_does_not_depend_on_sizes():
    assert default_config(matmul(1, 1, 1)) == default_config(matmul(9999, 77, 5))
    assert default_config(rowwise(1, 1)) == default_config(rowwise(5, 100_000))


def test_config_key_is_canonical_json():
    a = {"num_warps": 4, "BLOCK": 1024, "num_stages": 1}
    b = {"num_stages": 1, "BLOCK": 1024, "num_warps": 4}
    assert config_key(a) == config_key(b) == '{"BLOCK":1024,"num_stages":1,"num_warps":4}'
    assert json.loads(config_key(a)) == a
    assert config_key(a) != config_key({**a, "num_warps": 8})


def test_wrong_keys_and_bad_problems_raise():
    with pytest.raises(ValueError, match="needs exactly the keys"):
        prune(elementwise(100), [{"BLOCK_M": 64, "num_warps": 4, "num_stages": 1}], profile("H100"))
    with pytest.raises(ValueError, match="unknown kernel kind"):
        for_problem(Problem("conv", "float32", 1.0, 1.0))
    with pytest.raises(ValueError, match="needs m >= 1"):
        for_problem(Problem("matmul", "bfloat16", 1.0, 1.0, n=4, k=4, elem_bytes=2))
    with pytest.raises(ValueError, match="elem_bytes"):
        Problem("elementwise", "float32", 1.0, 1.0, numel=4, elem_bytes=3)


def test_next_pow2():
    assert [next_pow2(x) for x in (0, 1, 2, 3, 4, 5, 1000, 1024)] == \
        [1, 1, 2, 4, 4, 8, 1024, 1024]


@pytest.mark.parametrize("source, transposed", [
    ("extern Tensor[bfloat16, M, K] A\nextern Tensor[bfloat16, N, K] W\ndef main() {\n    return A @ transpose(W, 0, 1)\n}\n",
     True),
    ("extern Tensor[bfloat16, M, K] A\nextern Tensor[bfloat16, K, N] B\ndef main() {\n    return A @ B\n}\n", False),
])
def test_a_job_knows_whether_b_is_stored_transposed(source, transposed):
    """An `nn.Linear` weight read as B (stored [N, K]) marks the job's problem; both spaces have
    persistent twins (16-bit products)."""
    from xgbuild.compiler.driver import compile_source
    from xgbuild.tuner.jobs import plan
    jobs, _ = plan(compile_source(source, "b.xg").optimized.main, {"M": 256, "N": 512, "K": 128})
    job = next(j for j in jobs if j.spec.kind == "matmul")
    assert job.problem.b_transposed is transposed
    assert any("PROGRAMS" in c for c in candidates(job.problem, profile("H100")))
