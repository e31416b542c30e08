"""`scatter_add` (an embedding's gradient) on the GPU path, checked on a CPU: its kernel under
Triton's interpreter against the float64 reference (bf16, float32 read through strides, float64;
token counts that are no multiple of a block, replayed launches), indices outside the table adding
nothing and two runs giving the same bits, the schedule and tuning problem it makes, its config
space and cost model, and a cross-compile for sm_90."""

from __future__ import annotations

import pytest

from interpret_scatter import CASES, case
from test_gather_kernels import run_script
from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.codegen.templates import template
from xgbuild.compiler.ir.graph import Op
from xgbuild.hw import load_profile
from xgbuild.runtime.cuda import cubin_arch
from xgbuild.tuner.jobs import plan
from xgbuild.tuner.link import build_kernels
from xgbuild.tuner.predict import predict_ms
from xgbuild.tuner.space import candidates

# Sums in float32 (float64 for float64 rows), rounded once to the rows' dtype.
TOL = {"bfloat16": 4e-3, "float32": 1e-6, "float64": 1e-12}


def _interpret(arg: str):
    return run_script("interpret_scatter.py", arg)


@pytest.mark.parametrize("name", CASES)
def test_scatter_kernels_match_float64_reference(name: str) -> None:
    graph, _, _ = case(name)
    src_dtype = graph.node(next(n for n in graph.nodes if n.op is Op.SCATTER_ADD).inputs[1]).dtype
    report = _interpret(name)
    assert len(report) == 3
    assert any(out["replayed"] for out in report)
    for out in report:
        assert out["rel_err"] <= TOL[src_dtype], out


def test_out_of_range_indices_add_nothing_and_runs_are_bit_identical() -> None:
    report = _interpret("out_of_range")
    assert report["rel_err"] <= 1e-6 and report["same_bits"] and report["untouched_zero"], report


def test_scatter_is_a_kernel_of_its_own_that_consumers_do_not_join() -> None:
    graph, _, _ = case("embed_grad")
    s = schedule(graph)
    assert [k.kind for k in s.kernels] == ["scatter", "elementwise"]
    assert [graph.node(i).op for i in s.kernels[1].nodes] == [Op.CAST, Op.ADD]


def test_scatter_problem_space_and_cost_model() -> None:
    graph, _, vocab = case("embed_grad")
    jobs, _ = plan(graph, {"T": 8192})
    job = next(j for j in jobs if j.problem.kind == "scatter")
    p = job.problem
    assert (p.m, p.n, p.k, p.dtype) == (vocab, 24, 8192, "bfloat16")
    hw = load_profile("H100")
    t = template("scatter")
    kept = candidates(p, hw)
    assert kept and len(kept) <= t.max_candidates
    # Tiles past the table's 24 columns are pruned; every kept config is timed (no early stop).
    assert all(c["BLOCK_N"] <= 64 for c in kept) and t.bound_margin == 0
    # At GPT-2's size (50257 rows, 768 columns, 8192 tokens) the model prefers tiles whose index
    # blocks mostly miss and whose programs are few; any kept config is predicted in finite time.
    jobs, _ = plan(_gpt2(), {"T": 8192})
    big = jobs[0].problem
    ranked = candidates(big, hw)
    assert all(0 < predict_ms(big, c, hw) < 50 for c in ranked)
    assert predict_ms(big, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "num_warps": 8, "num_stages": 2}, hw) \
        < predict_ms(big, {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}, hw)


def _gpt2():
    from interpret_gather import Builder
    g = Builder()
    return g.graph(g.op(Op.SCATTER_ADD, g.input("int64", ("T",)), g.input("bfloat16", ("T", 768)), rows=50257))


def test_scatter_kernels_cross_compile_for_sm90() -> None:
    graph, _, _ = case("embed_grad")
    table = build_kernels(graph, load_profile("H100"), policy="predict", dims={"T": 8192})
    cubins = [data for path, data in table.files.items() if path.endswith(".cubin")]
    assert len(table.kernels) == 2 and cubins and all(cubin_arch(c) == 90 for c in cubins)
