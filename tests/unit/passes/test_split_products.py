"""passes/split_products.py: products of a long K whose tiles leave SMs idle are split along K (the
whole product, or the tail past whole waves), widened parts summed in a fixed order; the values
match float64 as the whole product's do, on the CPU and as Triton kernels under the interpreter;
GPT-2's weight gradients take the forms the wave model gives and nothing else is touched."""

from __future__ import annotations

import collections
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from xgbuild.build.target import target_profile
from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.ir.verify import IRError, verify
from xgbuild.compiler.passes import split_products as sp
from xgbuild.compiler.passes.split_products import Plan, plan, seconds
from xgbuild.runtime.cpu import CpuExecutor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "runtime"))
import split_products_cases as cases  # noqa: E402
from interpreted import interpreted_report  # noqa: E402

REPO = HERE.parents[2]
H200 = target_profile("H200")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture
def no_launch_cost(monkeypatch):
    """At the test program's size a launch outweighs the waves: the model then splits nothing."""
    monkeypatch.setattr(sp, "LAUNCH_S", 0.0)


def test_gpt2_weight_gradients_on_an_h200() -> None:
    # x^T @ dy over 8192 tokens: 36 tiles split whole; 144 tiles = a wave + 12, the tail split
    # (rows for [3072, 768], whose waves are whole rows of 6 tiles; columns for [768, 3072]).
    assert plan(768, 768, 8192, H200) == Plan(2)
    assert plan(3072, 768, 8192, H200) == Plan(8, 0, 2816)
    assert plan(768, 3072, 8192, H200) == Plan(8, 1, 2816)
    # 108 tiles fill most of one wave; the LM head's 2358 tiles and the forward products (M = 8192)
    # are many waves; a short K has nothing to split.
    for m, n, k in ((768, 2304, 8192), (768, 50304, 8192), (8192, 768, 768), (8192, 3072, 768),
                    (8192, 768, 3072), (768, 768, 256), (4096, 4096, 4096)):
        assert plan(m, n, k, H200) == Plan(), (m, n, k)


def test_the_model_weighs_waves_against_the_parts_moved() -> None:
    # Split whole, the [768, 768] product is one wave of half the K plus 4 float32 copies moved.
    whole, split = seconds(768, 768, 8192, Plan(), H200), seconds(768, 768, 8192, Plan(2), H200)
    assert split < whole / sp.MIN_GAIN
    # Split whole, [3072, 768]'s 288 tiles are 3 waves of half the K: no better than 2 waves.
    assert seconds(3072, 768, 8192, Plan(2), H200) > whole * 1.5
    # A GPU of other SMs moves the cut: 108 SMs (an A100) fill 18 rows of 6 tiles a wave.
    a100 = target_profile("A100")
    assert plan(3072, 768, 8192, a100).cut == 18 * 128


def test_each_form_verifies_and_matches_float64_on_the_cpu(no_launch_cost, monkeypatch) -> None:
    g = cases.optimized()
    widened = [n for n in g.nodes if n.op is Op.MATMUL and n.attr("widened")]
    assert sorted(tuple(n.shape) for n in widened) == [(2, 128, 64), (2, 128, 128), (2, 128, 256), (2, 256, 128)]
    assert all(n.dtype == "float32" and g.node(n.inputs[0]).dtype == "bfloat16" for n in widened)
    # Two tails: a top product each, top and summed tail each placed (unindex) and added.
    assert sum(n.op is Op.UNINDEX for n in g.nodes) == 2 * 2
    monkeypatch.setattr(sp, "MIN_GAIN", float("inf"))
    whole = cases.optimized()
    assert not any(n.attr("widened") for n in whole.nodes)
    for seed in (0, 1):
        values = cases.inputs(seed)
        ref = cases.reference(values)
        got = [CpuExecutor(check=False).run(g, values).values[i] for i in tree_ids(g.output)]
        base = [CpuExecutor(check=False).run(whole, values).values[i] for i in tree_ids(whole.output)]
        for out, b, r in zip(got, base, ref):
            assert out.dtype == b.dtype and out.shape == b.shape
            # bfloat16 results: the rounding of the result, as the whole product's.
            assert _rel(out, r) <= _rel(b, r) * 1.05 + 1e-6 and _rel(out, r) < 5e-3


def test_the_kernels_match_float64_under_the_interpreter() -> None:
    report = interpreted_report(HERE / "interpret_split_products.py")
    assert report["widened"] == 4
    assert all(err < 7e-3 for err in report["errors"]), report


def test_the_same_bits_every_run(no_launch_cost) -> None:
    g = cases.optimized()
    values = cases.inputs(3)
    runs = [[CpuExecutor(check=False).run(g, values).values[i] for i in tree_ids(g.output)] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_left_alone_without_static_16_bit_2d_products() -> None:
    # float32, batched and symbolic products, and a float16 one whose tiles fill the GPU.
    src = """extern Tensor[float32, 128, 8192] A
extern Tensor[float32, 8192, 128] B
extern Tensor[bfloat16, 4, 128, 8192] C
extern Tensor[bfloat16, 4, 8192, 128] E
extern Tensor[bfloat16, n, 8192] F
extern Tensor[bfloat16, 8192, 128] G
def main() {
    return (A @ B, C @ E, F @ G)
}
"""
    g = cases.optimized(source=src)
    assert not any(n.attr("widened") for n in g.nodes)
    assert sum(n.op is Op.MATMUL for n in g.nodes) == 3


def test_programs_of_several_gpus_are_left_alone(tmp_path) -> None:
    """Data parallel over 2 GPUs: the weight gradient's K (8192 tokens) is the sharded batch, and
    the program's engine is planned (layouts inferred) as it was."""
    from xgbuild.compiler.passes.shard import plan_of
    src = """TARGET_GPU = H200
NUM_GPU = 2
extern Tensor[bfloat16, 8192, 768] X
extern Tensor[bfloat16, 8192, 768] Y
extern Tensor[bfloat16, 768, 768] W
def loss(Tensor[bfloat16, B, D] x, Tensor[bfloat16, B, D] y, Tensor[bfloat16, D, D] w) -> float32 {
    d = cast(x @ w - y, float32)
    return mean(d * d)
}
def main() {
    with shard(X, dim=0), shard(Y, dim=0):
        (l, g) = value_and_grad(loss, wrt=(w))(X, Y, W)
    return (l, W - cast(0.1, bfloat16) * g)
}
"""
    c = compile_source(src, "dp.xg", verify_each=True)
    g = c.optimized.main
    assert not any(n.attr("widened") for n in g.nodes)
    assert any(n.op is Op.REDUCE_SCATTER or n.op is Op.ALL_REDUCE for n in g.nodes)
    plan_of(g, 2, c.optimized.profile)
    # The same program on one GPU splits its weight gradient.
    one = compile_source(src.replace("NUM_GPU = 2", "NUM_GPU = 1"), "dp1.xg").optimized.main
    assert any(n.attr("widened") for n in one.nodes)


def test_a_widened_product_takes_16_bit_operands() -> None:
    g = compile_source("extern Tensor[float32, 4, 8] A\nextern Tensor[float32, 8, 2] B\ndef main() {\n"
                       "    return A @ B\n}\n", "w.xg").optimized.main
    mm = next(n for n in g.nodes if n.op is Op.MATMUL)
    bad = g.with_nodes([replace(n, attrs=(("widened", True),)) if n.id == mm.id else n for n in g.nodes], g.output)
    with pytest.raises(IRError, match="widened"):
        verify(bad)


@pytest.mark.slow
def test_gpt2_training_step_schedule_on_an_h200() -> None:
    """models/train.xg at full size for an H200: 12 [768, 768] weight gradients split whole and 24
    split at their tails; every operand a view (no copy kernel), each tail one kernel to place."""
    g = compile_file(REPO / "models" / "train.xg", CheckOptions(target="H200")).optimized.main
    widened = collections.Counter(tuple(n.shape) for n in g.nodes if n.op is Op.MATMUL and n.attr("widened"))
    assert widened == {(2, 768, 768): 12, (8, 256, 768): 12, (8, 768, 256): 12}
    s = schedule(g)
    kinds = collections.Counter(k.kind for k in s.kernels)
    # 147 products: a split one stays one (its parts' batched product), a tail adds its top's.
    assert kinds["matmul"] == 147 + 24
    # Each split adds one element-wise kernel (its parts' sum), each tail one more (the placing).
    # (79: the LayerNorms' per-row values recomputed for the backward are written by their forward
    # row kernels, schedule.TINY_REMAT, where they were 25 element-wise kernels of their own; the
    # MLPs' GELU gradients by their bias gradients' first stages, split-reductions' exported casts,
    # where they were 12; the heads' gradients by the dk/dv kernels into their qkv slots,
    # placement.placed_grads, where 12 kernels placed them; the merged heads by the attention
    # kernels, passes/merge_heads.py, where 12 cast-cast kernels copied them.)
    assert kinds["elementwise"] == 67 + 36 + 24
    for k in s.kernels:
        if k.kind == "matmul" and g.node(k.anchor).attr("widened"):
            assert all(g.node(i).op in (Op.TRANSPOSE, Op.RESHAPE, Op.INDEX) for i in s.inputs(k))
            outs = set(s.outputs(k))
            readers = [r for r in s.kernels if any(i in outs or g.node(i).op is Op.INDEX and g.node(i).inputs[0] in outs
                                                   for i in s.inputs(r))]
            assert [r.kind for r in readers] == ["elementwise"]
            assert len(s.inputs(readers[0])) == g.node(k.anchor).shape[0]      # the parts, nothing else
