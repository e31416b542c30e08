"""The launch ABI (compiler/codegen/launch.py): binding on meta tensors, the kind-specific variant
assumptions each template checks, and grids."""

from __future__ import annotations

import torch

from xgbuild.compiler.codegen.launch import bind, choose, grid_for, holds
from xgbuild.compiler.codegen.launch_abi import Compiled, KernelPlan, Variant
from xgbuild.compiler.driver import compile_source
from xgbuild.dtypes import TORCH_DTYPES
from xgbuild.runtime.values import Values
from xgbuild.tuner.jobs import plan

MATMUL = """extern Tensor[float32, M, K] A
extern Tensor[float32, K, N] B
def main() {
    return A @ B
}
"""

SOFTMAX = """extern Tensor[float32, R, C] X
def main() {
    return softmax(X, dim=1)
}
"""


def _launch(src: str, dims: dict[str, int]):
    """The spec of the program's one kernel and its launch on meta tensors at `dims`."""
    graph = compile_source(src).optimized.main
    (job,), _ = plan(graph, dims)
    binding = job.sites[0][0]
    g = job.graph
    value = Values(g, lambda n: torch.empty(tuple(n.shape), dtype=TORCH_DTYPES[n.dtype], device="meta"), meta=True)
    outs = [torch.empty(tuple(g.node(n).shape), dtype=TORCH_DTYPES[g.node(n).dtype], device="meta")
            for n in binding.outputs]
    generic = Compiled(Variant.generic(), {}, [], [], None)
    return job.spec, bind(KernelPlan(job.spec, binding, [generic]), g, value, outs)


def _compiled(config: dict[str, int], **assume) -> Compiled:
    return Compiled(Variant(**assume), config, [], [], None)


def test_matmul_even_k_needs_k_a_multiple_of_block_k_and_grid_tiles_the_product():
    config = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}
    spec, even = _launch(MATMUL, {"M": 64, "N": 96, "K": 128})
    _, odd = _launch(MATMUL, {"M": 64, "N": 96, "K": 100})
    assert (even.ints["M"], even.ints["N"], even.ints["K"], even.ints["batch"]) == (64, 96, 128, 1)
    assert holds(_compiled(config, even_k=True), even, spec)
    assert not holds(_compiled(config, even_k=True), odd, spec)
    assert grid_for(_compiled(config), spec, even) == (2 * 3, 1, 1)
    fast, generic = _compiled(config, even_k=True), _compiled(config)
    assert choose(KernelPlan(spec, None, [fast, generic]), odd) is generic


def test_rowwise_single_needs_the_row_in_one_tile_and_one_program_per_row():
    spec, launch = _launch(SOFTMAX, {"R": 5, "C": 100})
    assert (launch.ints["R"], launch.ints["C"]) == (5, 100)
    assert holds(_compiled({"BLOCK_N": 128}, single=True), launch, spec)
    assert not holds(_compiled({"BLOCK_N": 64}, single=True), launch, spec)
    assert grid_for(_compiled({"BLOCK_N": 64}), spec, launch) == (5, 1, 1)


def test_int32_variant_refuses_a_launch_whose_offsets_need_int64():
    spec, launch = _launch(SOFTMAX, {"R": 2**16, "C": 2**16})
    assert not holds(_compiled({"BLOCK_N": 1024}, wide=False), launch, spec)
    assert holds(_compiled({"BLOCK_N": 1024}, wide=True), launch, spec)


def test_one_odd_size_leaves_the_other_operands_their_alignment_hints():
    """A 50257-wide LM head: N is no multiple of 16, K and the strides are. The tuned variant hints
    everything but N (vector loads of A and B), and a launch whose K breaks the promise falls back
    to the generic variant rather than running code that assumes it."""
    from xgbuild.compiler.codegen.templates import emit
    from xgbuild.tuner.space import default_config
    graph = compile_source(MATMUL).optimized.main
    (job,), _ = plan(graph, {"M": 64, "N": 50257, "K": 768})
    cfg = default_config(job.problem)
    variant = job.fast_variant(cfg)
    # B's row stride is N here; A's (K) and K itself keep their hints.
    assert variant.aligned and variant.unaligned == ("N", "p1_s0")
    assert variant.hinted("K") and variant.hinted("p0_s0") and not variant.hinted("N")
    assert Variant.from_json(variant.to_json()) == variant
    assert "unaligned" not in Variant(aligned=True).to_json()      # earlier variants' JSON is unchanged
    em = emit(job.spec, cfg, variant)
    assert {"K", "p0_s0"} <= set(em.div16) and not {"N", "p1_s0"} & set(em.div16)
    fast = Compiled(variant, cfg, [], em.div16, None)
    generic = _compiled(cfg)
    spec, lm_head = _launch(MATMUL, {"M": 64, "N": 50257, "K": 768})
    assert holds(fast, lm_head, spec)
    _, odd_k = _launch(MATMUL, {"M": 64, "N": 50257, "K": 770})
    assert choose(KernelPlan(spec, None, [fast, generic]), odd_k) is generic
