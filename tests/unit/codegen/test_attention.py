"""Naive attention, `softmax(chain(q @ kT), dim=-1) @ v`, fused into one flash-style kernel: what
the schedule recognises (and what it must leave alone), and the kernel's numbers under Triton's
interpreter against the float64 CPU reference, tuned at one shape and run at aligned and odd ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.codegen.templates import kernel_specs
from xgbuild.compiler.codegen.triton_attention import causal
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.hw import load_profile
from xgbuild.tuner.jobs import plan, tuning_env
from xgbuild.tuner.predict import floor_ms, predict_ms
from xgbuild.compiler.codegen.templates.attention import smem_bytes as attention_smem_bytes
from xgbuild.compiler.codegen.templates.base import Problem
from xgbuild.tuner.space import candidates, default_config, full_space, prune

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent

CAUSAL = """import std.nn
extern Tensor[float32, T, D] X
extern Tensor[float32, D, D] WQ
extern Tensor[float32, D, D] WK
extern Tensor[float32, D, D] WV
extern float32 SCALE
def main() {
    return causal_attention(X, WQ, WK, WV, SCALE)
}
"""

# Multi-head, T != S, v's head differing from q's, a [B, 1, 1, S] boolean mask broadcast over heads
# and queries, a [T, S] float bias, scaling by division.
MASKED = """extern Tensor[float32, B, H, T, D] Q
extern Tensor[float32, B, H, S, D] K
extern Tensor[float32, B, H, S, E] V
extern Tensor[bool, B, 1, 1, S] KEEP
extern Tensor[float32, T, S] BIAS
def main() {
    s = where(KEEP, (Q @ transpose(K)) / 8.0 + BIAS, -1e30)
    return softmax(s, dim=3) @ V
}
"""

# Every third row masked whole with -inf (softmax gives NaN there, fused or not), and the first 40
# keys of every row: a key block of -inf before the real scores.
MASKED_ROWS = """extern Tensor[float32, T, D] Q
extern Tensor[float32, S, D] K
extern Tensor[float32, S, D] V
def main() {
    keep = (reshape(arange(T), [T, 1]) % 3 != 0) and (reshape(arange(S), [1, S]) >= 40)
    neg = log(cast(reshape(arange(S), [1, S]), float32) * 0.0)
    return softmax(where(keep, Q @ transpose(K), neg), dim=1) @ V
}
"""

# bf16 multi-head causal attention written naively, as the benchmark's workload (docs/codegen.md).
MHA_BF16 = """extern Tensor[bfloat16, B, H, T, D] Q
extern Tensor[bfloat16, B, H, T, D] K
extern Tensor[bfloat16, B, H, T, D] V
def main() {
    causal = reshape(arange(T), [T, 1]) >= reshape(arange(T), [1, T])
    s = where(causal, cast(Q @ transpose(K), float32) * 0.088, -1e9)
    return cast(softmax(s, dim=3), bfloat16) @ V
}
"""


def _kinds(src: str) -> list[str]:
    return [k.kind for k in schedule(compile_source(src).optimized.main).kernels]


def _attention_specs(graph) -> list:
    return [spec for spec, _b in kernel_specs(schedule(graph)) if spec.kind == "attention"]


# --- what fuses ----------------------------------------------------------------------------------

def test_example_attention_is_one_kernel() -> None:
    g = compile_file(REPO / "examples" / "attention.xg").optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels] == ["attention"]
    k = s.kernels[0]
    assert s.outputs(k) == [k.anchor] and k.anchor == g.output["t"]
    (spec,) = _attention_specs(g)
    assert [n.op for n in spec.nodes] == ["matmul", "cast", "mul", "softmax", "cast", "matmul"]
    assert not causal(spec)


def test_causal_attention_fuses_with_its_mask_computed_in_the_kernel() -> None:
    g = compile_source(CAUSAL).optimized.main
    s = schedule(g)
    # q, k and v projections, then the attention: no kernel writes the [T, T] mask or scores.
    assert [k.kind for k in s.kernels] == ["matmul", "matmul", "matmul", "attention"]
    att = s.kernels[-1]
    assert all(len(g.node(i).shape) < 2 or g.node(i).dtype != "bool" for i in s.inputs(att))
    assert att.inlined and set(att.inlined) <= s.inlined
    (spec,) = _attention_specs(g)
    assert causal(spec)
    assert [spec.operands[j][1] for j in range(len(spec.operands))].count("scalar") == 1   # SCALE


def test_broadcast_mask_and_bias_are_operands_of_the_fused_kernel() -> None:
    g = compile_source(MASKED).optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels] == ["attention"]
    (spec,) = _attention_specs(g)
    _spec, binding = kernel_specs(s)[0]
    names = {g.node(i).attr("name") for i in binding.operands}
    assert {"Q", "V", "KEEP", "BIAS"} <= names and len(binding.operands) == 5    # and K's transpose
    assert not causal(spec)


def test_gpt_style_shared_causal_mask_is_inlined_in_every_layer() -> None:
    # One mask node read by two layers' attentions (as the PyTorch importer's CSE leaves it).
    src = """extern Tensor[float32, T, D] Q
extern Tensor[float32, T, D] K
extern Tensor[float32, T, D] V
def main() {
    m = reshape(arange(T), [1, T]) <= reshape(arange(T), [T, 1])
    a = softmax(where(m, (Q @ transpose(K)) * 0.5, -1e9), dim=1) @ V
    return softmax(where(m, (a @ transpose(K)) * 0.5, -1e9), dim=1) @ V
}
"""
    g = compile_source(src).optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels] == ["attention", "attention"]
    assert all(causal(spec) for spec in _attention_specs(g))


@pytest.mark.parametrize("body", [
    # the probabilities are a graph output too
    "p = softmax((Q @ transpose(K)) * 0.125, dim=1)\n    return p @ V, p",
    # the probabilities are read again
    "p = softmax((Q @ transpose(K)) * 0.125, dim=1)\n    return p @ V + sum(p, dim=1, keepdim=true)",
    # the scores are read again
    "s = Q @ transpose(K)\n    return softmax(s, dim=1) @ V, s",
    # softmax over the query dim, not the keys
    "return softmax((Q @ transpose(K)) * 0.125, dim=0) @ V",
    # not a product with v after the softmax
    "return exp(softmax((Q @ transpose(K)) * 0.125, dim=1))",
])
def test_attention_that_does_not_match_keeps_todays_kernels(body: str) -> None:
    src = ("extern Tensor[float32, S, D] Q\nextern Tensor[float32, S, D] K\nextern Tensor[float32, S, S] V\n"
           f"def main() {{\n    {body}\n}}\n")
    kinds = _kinds(src)
    assert "attention" not in kinds and "rowwise" in kinds and "matmul" in kinds


def test_training_step_recomputes_the_probabilities() -> None:
    # The gradient of attention recomputes the probabilities (passes/flash.py): the forward pass
    # keeps none, so its attention is one fused kernel, and the gradient's kernels are flash ones.
    src = """extern Tensor[float32, S, D] Q
extern Tensor[float32, S, D] K
extern Tensor[float32, S, D] V
def loss(Tensor[float32, S, D] q, Tensor[float32, S, D] k, Tensor[float32, S, D] v) -> float32 {
    return sum(softmax((q @ transpose(k)) * 0.125, dim=1) @ v)
}
def main() {
    return grad(loss, wrt=q)(Q, K, V)
}
"""
    g = compile_source(src).optimized.main
    s = schedule(g)
    (sm,) = [n.id for n in g.nodes if n.op.value == "softmax"]
    assert len(g.users()[sm]) == 1
    (fwd,) = [k for k in s.kernels if k.kind == "attention"]
    # q's gradient alone: dq (dk and dv are not asked for); the forward kernel writes the row
    # log-sum-exps it reads.
    assert sorted((g.node(k.anchor).op.value, g.node(k.anchor).attr("wrt")) for k in s.kernels if k.kind == "flash") \
        == [("attn_grad", "q")]
    assert sorted(g.node(i).op.value for i in s.outputs(fwd)) == ["attn_lse", "matmul"]


# --- tuning --------------------------------------------------------------------------------------

def _mha_job(dims: dict):
    g = compile_source(MHA_BF16).optimized.main
    jobs, _ = plan(g, tuning_env(g, dims))
    (job,) = [j for j in jobs if j.spec.kind == "attention"]
    return job


def test_attention_problem_counts_flops_and_bytes() -> None:
    job = _mha_job({"B": 4, "H": 32, "T": 2048, "D": 128})
    p = job.problem
    assert (p.kind, p.batch, p.m, p.n, p.k, p.dv, p.causal) == ("attention", 128, 2048, 2048, 128, 128, True)
    dense = 4 * 128 * 2048 * 2048 * 128
    assert dense / 2 <= p.flops <= dense / 2 * 1.05            # causal: half, plus the chain's few ops
    assert p.bytes == 4 * 128 * 2048 * 128 * 2                  # q, k, v and the output, bf16


def test_attention_configs_fit_the_chip_and_prediction_is_sane() -> None:
    job = _mha_job({"B": 4, "H": 32, "T": 2048, "D": 128})
    p = job.problem
    h100 = load_profile("H100")
    kept, dropped = prune(p, full_space(p), h100)
    assert kept and dropped
    assert all(attention_smem_bytes(c, 2) <= h100.max_shared_memory_per_block_bytes for c in kept)
    assert any("shared memory" in why or "registers" in why for _c, why in dropped)
    cands = candidates(p, h100)
    assert all(c["BLOCK_D"] == 128 and c["BLOCK_DV"] == 128 for c in cands)
    best = cands[0]
    assert best["BLOCK_M"] >= 64 and best["BLOCK_N"] >= 32
    ms = predict_ms(p, best, h100)
    assert floor_ms(p, h100) <= ms < 10 * floor_ms(p, h100)
    # Skipping the blocks above the diagonal is predicted to pay.
    dense = Problem(**{**p.__dict__, "causal": False, "flops": p.flops * 2})
    assert predict_ms(dense, best, h100) > 1.5 * ms
    # The generic config loops over the head dim and splits wide v heads: valid for any size.
    assert default_config(p)["BLOCK_D"] == 64 and job.fast_variant(best).single


def test_float32_attention_keeps_score_tiles_small_enough_for_fma_products() -> None:
    # CUDA-core products hold both operands' fragments in registers: on an H100 a 128x128 score tile
    # over 8 warps (the model's pick before this rule) ran 12.8 ms against 0.35 ms for 32x64 over 4.
    bf16 = _mha_job({"B": 8, "H": 12, "T": 512, "D": 64}).problem
    fp32 = Problem(**{**bf16.__dict__, "dtype": "float32", "elem_bytes": 4})
    h100 = load_profile("H100")
    kept, dropped = prune(fp32, full_space(fp32), h100)
    exact = [c for c in kept if not c["TF32X3"]]
    assert exact and all(c["BLOCK_M"] * c["BLOCK_N"] <= 16 * 32 * c["num_warps"] for c in exact)
    assert any("CUDA cores" in why for _c, why in dropped)
    top = [c for c in candidates(fp32, h100) if not c["TF32X3"]][0]
    assert top["BLOCK_M"] * top["BLOCK_N"] <= 64 * 64
    # Tensor-core dtypes keep the large tiles, and so do float32's 3xTF32 products (warpgroup
    # MMAs: BLOCK_M of 64 or more; never for 16-bit operands).
    assert any(c["BLOCK_M"] * c["BLOCK_N"] > 16 * 32 * c["num_warps"] for c in candidates(bf16, h100))
    x3 = [c for c in kept if c["TF32X3"]]
    assert x3 and all(c["BLOCK_M"] >= 64 for c in x3)
    assert any(c["BLOCK_M"] * c["BLOCK_N"] > 16 * 32 * c["num_warps"] for c in x3)
    assert not any(c["TF32X3"] for c in full_space(bf16))
    assert any("TF32X3 needs BLOCK_M >= 64" in why for _c, why in dropped)


def test_attention_spec_text_changes_with_the_mask() -> None:
    a = _attention_specs(compile_source(MHA_BF16).optimized.main)[0]
    b = _attention_specs(compile_source(MHA_BF16.replace(">= reshape", "> reshape")).optimized.main)[0]
    assert causal(a) and not causal(b) and a.digest != b.digest


# --- numbers under the interpreter ---------------------------------------------------------------

def _interpret(tmp_path: Path, src: str | Path, tune: dict, runs: list[dict]) -> dict:
    if isinstance(src, str):
        path = tmp_path / "prog.xg"
        path.write_text(src)
    else:
        path = src
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(HERE / "interpret_attention.py"), str(path), json.dumps(tune),
                           json.dumps(runs)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


BF16_EXAMPLE = REPO / "examples" / "attention.xg"

# The causal fill above every kept score: each row but the last attends to its masked (future)
# keys alone, which the kernel skips and must account for after its loop.
FILL_CARRIES = """extern Tensor[float32, T, D] Q
extern Tensor[float32, T, D] K
extern Tensor[float32, T, D] V
def main() {
    causal = reshape(arange(T), [T, 1]) >= reshape(arange(T), [1, T])
    s = where(causal, (Q @ transpose(K)) * 0.125 - 2000.0, -1000.0)
    return softmax(s, dim=1) @ V
}
"""

# Sharp bfloat16 scores (standard deviation about 23): bfloat16's spacing there is 0.125. Rounded to
# the product's dtype before the softmax, the output was 1.2e-2 to 1.3e-2 off (under the
# interpreter, rounding to nearest as a GPU: runtime/interpret.py); kept float32
# (triton_attention.py), 1.0e-3 to 1.2e-3: p's and the output's rounding.
SHARP_TOL = 4e-3
SHARP_BF16 = MHA_BF16.replace("* 0.088", "* 4.0")

CASES = {
    # name: (program, tolerance, tuning dims, odd dims)
    "example_bf16": (BF16_EXAMPLE, 3e-2, {"S": 32, "D": 64}, {"S": 37, "D": 50}),
    "example_fp32": ("fp32", 1e-4, {"S": 32, "D": 64}, {"S": 37, "D": 50}),
    # D=100 loops over the head dim in the generic kernel
    "causal_fp32": (CAUSAL, 1e-4, {"T": 64, "D": 32}, {"T": 37, "D": 100}),
    # E=70 splits v's head over two programs in the generic kernel
    "masked_fp32": (MASKED, 1e-4, {"B": 2, "H": 2, "T": 32, "S": 32, "D": 64, "E": 32},
                    {"B": 3, "H": 2, "T": 37, "S": 23, "D": 50, "E": 70}),
    "masked_rows_fp32": (MASKED_ROWS, 1e-4, {"T": 32, "S": 64, "D": 64}, {"T": 37, "S": 71, "D": 50}),
    "mha_causal_bf16": (MHA_BF16, 3e-2, {"B": 1, "H": 2, "T": 128, "D": 32}, {"B": 2, "H": 1, "T": 37, "D": 50}),
    "sharp_causal_bf16": (SHARP_BF16, SHARP_TOL, {"B": 1, "H": 2, "T": 128, "D": 32}, {"B": 2, "H": 1, "T": 37, "D": 50}),
    "causal_fill_carries_fp32": (FILL_CARRIES, 1e-4, {"T": 256, "D": 32}, {"T": 300, "D": 50}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_kernels_match_float64_reference(tmp_path: Path, name: str) -> None:
    src, tol, tune, odd = CASES[name]
    if src == "fp32":
        src = BF16_EXAMPLE.read_text().replace("bfloat16", "float32")
    report = _interpret(tmp_path, src, tune, [tune, odd])
    assert "attention" in report["kinds"] and "rowwise" not in report["kinds"]
    (aligned, ragged) = report["runs"]
    for run, variant in ((aligned, "tuned"), (ragged, "generic")):
        assert run["outputs"]
        for out in run["outputs"]:
            assert out["rel_err"] < tol, (run["dims"], out)
            assert variant in out["variants"], (run["dims"], out)


def test_tuning_reference_computes_the_inlined_causal_mask() -> None:
    # The tuner's float64 reference for a job recomputes the kernel's nodes from its operands:
    # the causal mask has no kernel, so it must be recomputed too (not drawn at random).
    import torch

    from xgbuild.tuner.jobdata import JobData
    g = compile_source(CAUSAL).optimized.main
    jobs, _ = plan(g, tuning_env(g, {"T": 24, "D": 16}))
    (job,) = [j for j in jobs if j.spec.kind == "attention"]
    data = JobData(job)
    binding, _nodes = job.sites[0]
    jq, jk, jv = job.spec.matmul
    (js,) = [j for j, (_dt, level) in enumerate(job.spec.operands) if level == "scalar"]
    value = data.value_fn("cpu")
    q, kt, v, scale = (value(binding.operands[j]).double() for j in (jq, jk, jv, js))
    keep = torch.ones(24, 24).tril().bool()
    want = torch.softmax(torch.where(keep, q @ kt * scale, -1e9), dim=-1) @ v
    (got,) = data.reference()
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_overlapping_patterns_fuse_the_first_only(tmp_path: Path) -> None:
    """The first attention's p @ v is also the scores of a second softmax: one kernel cannot own
    it twice, so the second stays unfused, and the numbers still match."""
    src = """extern Tensor[float32, T, D] Q
extern Tensor[float32, T, D] K
extern Tensor[float32, T, D] V
extern Tensor[float32, D, E] W
def main() {
    a = softmax((Q @ transpose(K)) * 0.125, dim=1) @ V
    return softmax(a, dim=1) @ W
}
"""
    g = compile_source(src).optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels].count("attention") == 1
    report = _interpret(tmp_path, src, {"T": 32, "D": 32, "E": 16}, [{"T": 32, "D": 32, "E": 16}])
    for out in report["runs"][0]["outputs"]:
        assert out["rel_err"] < 1e-4, out


def test_float32_attention_with_3xtf32_compiles_to_tensor_core_products() -> None:
    """A TF32X3 config of a float32 attention lowers, for sm_90 on this GPU-less host, to TF32
    tensor-core products (three per exact one) in both of its products."""
    from xgbuild.compiler.codegen.build import compile_emitted
    from xgbuild.compiler.codegen.templates import emit
    src = MHA_BF16.replace("bfloat16", "float32")
    g = compile_source(src).optimized.main
    jobs, _ = plan(g, tuning_env(g, {"B": 2, "H": 2, "T": 256, "D": 64}))
    (job,) = [j for j in jobs if j.spec.kind == "attention"]
    assert job.problem.dtype == "float32"
    kept, _dropped = prune(job.problem, full_space(job.problem), load_profile("H100"))
    (config,) = [c for c in kept if c["TF32X3"] and (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"])
                 == (64, 64, 4, 2)]
    emitted = emit(job.spec, config, job.fast_variant(config))
    exact = emit(job.spec, {**config, "TF32X3": 0}, job.fast_variant(config))
    # both products, in the interior and the masked key-block loops
    products = exact.source.count('input_precision="ieee"')
    assert products == 4 and 'input_precision="tf32x3"' not in exact.source
    assert emitted.source.count('input_precision="tf32x3"') == products and "ieee" not in emitted.source
    ptx = compile_emitted(emitted, 90, 4, 2).asm["ptx"]
    assert "tf32" in ptx


MERGED = """extern Tensor[float32, 2, 4, 16, 8] Q
extern Tensor[float32, 2, 4, 16, 8] K
extern Tensor[float32, 2, 4, 16, 8] V
extern Tensor[float32, 32, 8] W
def main() {{
    o = softmax((Q @ transpose(K)) * 0.35, dim=3) @ V
    {body}
}}
"""


@pytest.mark.parametrize("body,strided", [
    # heads merged: a reshape of the transposed output is a copy; the kernel writes it instead
    ("return reshape(transpose(o, 1, 2), [2, 16, 32]) @ W", True),
    # a permutation alone is a view: nothing to save
    ("return transpose(o, 1, 2) * 2.0", False),
    # the output read elsewhere too: it is written as it is
    ("return (reshape(transpose(o, 1, 2), [2, 16, 32]) @ W, o)", False),
    # a reshape that is a view of the contiguous output: nothing to save
    ("return reshape(o, [2, 64, 8]) @ reshape(W, [8, 32])", False),
], ids=["merged", "transpose_only", "two_readers", "view_reshape"])
def test_attention_writes_its_output_as_the_merged_heads_view(body: str, strided: bool) -> None:
    from xgbuild.compiler.codegen.templates import template
    from xgbuild.compiler.ir.graph import Op
    graph = compile_source(MERGED.format(body=body)).optimized.main
    sched = schedule(graph)
    (k,) = [k for k in sched.kernels if k.kind == "attention"]
    spec, binding = template("attention").spec(sched, k)
    assert spec.strided_out is strided
    written = graph.node(binding.outputs[0])
    if strided:
        assert written.op is Op.RESHAPE and tuple(written.shape) == (2, 16, 32)
        assert binding.outputs[0] in sched.outputs(k) and k.anchor not in sched.outputs(k)
    else:
        assert binding.outputs[0] == k.anchor
