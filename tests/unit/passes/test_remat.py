"""Rematerialisation (passes/remat.py): element-wise values a backward pass reads are computed again
there instead of kept from the forward pass; gradients unchanged (float64, against torch.autograd),
no recomputed value fused into an earlier kernel, bfloat16 element-wise values never recomputed,
and a GPT-2-small training step's peak held memory far lower."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from xgbuild.build.package import engine_of
from xgbuild.compiler.codegen.launch_abi import ExternStep
from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op
from xgbuild.runtime.lifetimes import frees, peak_bytes
from xgbuild.runtime.native import made_by
from xgbuild.tuner.jobs import plan, tuning_env

REPO = Path(__file__).resolve().parents[3]
BLOCK = """extern Tensor[{dt}, T, D] X
extern Tensor[{dt}, D, F] W
extern Tensor[{dt}, F] C
def f(Tensor[{dt}, T, D] x, Tensor[{dt}, D, F] w, Tensor[{dt}, F] b) -> {dt} {{
    c = x - mean(x, dim=1, keepdim=true)
    h = c * rsqrt(mean(c * c, dim=1, keepdim=true) + 1e-5)
    a = h @ w + b
    g = 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
    p = softmax(g, dim=1)
    return sum(where(g > 0.0, p, 0.5 * p) @ transpose(w) * x)
}}
def main() {{
    return value_and_grad(f, wrt=(x, w, b))(X, W, C)
}}
"""


def _torch_block(x, w, b):
    c = x - x.mean(1, keepdim=True)
    h = c * torch.rsqrt((c * c).mean(1, keepdim=True) + 1e-5)
    a = h @ w + b
    g = 0.5 * a * (1.0 + torch.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
    p = torch.softmax(g, 1)
    return (torch.where(g > 0, p, 0.5 * p) @ w.T * x).sum()


def test_gradients_are_unchanged_and_values_are_recomputed() -> None:
    compiled = compile_source(BLOCK.format(dt="float64"), "block.xg")
    graph = compiled.optimized.main
    clones = [n for n in graph.nodes if n.attr("remat")]
    assert clones, "the backward pass recomputes nothing"
    assert {n.op for n in clones} & {Op.TANH, Op.MUL, Op.SUB}
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    x, w, b = (torch.tensor(rng.standard_normal(s)) for s in ((6, 8), (8, 5), (5,)))
    value, grads = engine_of(compiled).run({"X": x, "W": w, "C": b}).value
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    ref = _torch_block(xs, ws, bs)
    ref.backward()
    assert abs(float(value) - float(ref)) <= 1e-9 * abs(float(ref))
    for got, want in zip(grads, (xs.grad, ws.grad, bs.grad)):
        assert float((got - want).norm() / want.norm()) < 1e-10


def test_recomputed_values_stay_out_of_earlier_kernels() -> None:
    graph = compile_source(BLOCK.format(dt="float32"), "block.xg").optimized.main
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    checked = 0
    for k in schedule(graph).kernels:
        re = [position[x] for x in k.nodes if graph.node(x).attr("remat")]
        if re:
            checked += 1
            assert not any(position[x] < min(re) and not graph.node(x).attr("remat") for x in k.nodes), k
    assert checked


def test_bfloat16_element_wise_values_are_not_recomputed() -> None:
    """A kernel computes a bfloat16 value in float32 and rounds it where it stores it: computed
    again inside another kernel it could differ. Only casts (which round) are recomputed."""
    graph = compile_source(BLOCK.format(dt="bfloat16").replace("-> bfloat16", "-> float32")
                           .replace("return sum(", "return cast(sum(").replace("* x)\n}", "* x), float32)\n}"),
                           "block.xg").optimized.main
    clones = [n for n in graph.nodes if n.attr("remat")]
    assert all(n.dtype not in ("bfloat16", "float16") or n.op is Op.CAST for n in clones), clones
    # ...nor a value that reads one made by an element-wise op (a fused forward reader saw it unrounded).
    for n in clones:
        for i in n.inputs:
            m = graph.node(i)
            while m.op in (Op.RESHAPE, Op.TRANSPOSE) and m.inputs:
                m = graph.node(m.inputs[0])
            assert not (m.dtype == "bfloat16" and m.op in (Op.MUL, Op.ADD, Op.SUB, Op.TANH, Op.WHERE)), (n, m)


class _Plan:
    def __init__(self, binding) -> None:
        self.binding = binding


def test_the_training_step_holds_under_a_third() -> None:
    """models/train.xg at its real size (GPT-2 small, 8 x 1024 tokens, bf16 products): the kernel
    outputs alive at once. Kept to the end of the run (what an H200 held: 53 GB; 18 GB once casts
    moved across views left no float32 copies of attention's operands), then dropped after their
    last reader (23.3 GB before recomputation), also recomputed (12.4 GB), and with attention's
    probabilities recomputed by its gradient (5.7 GB, then 5.3 GB; torch.compile's measured 8.8)."""
    graph = compile_source((REPO / "models" / "train.xg").read_text(), "train.xg").optimized.main
    _jobs, launches = plan(graph, tuning_env(graph, {}))
    plans = [ExternStep(b) if ident == "extern" else _Plan(b) for ident, b in launches]
    made = made_by(plans)
    kept, dropped = peak_bytes(graph, plans, made, None), peak_bytes(graph, plans, made, frees(graph, plans, made))
    assert dropped < 6e9 and dropped < kept / 3, (kept, dropped)


def test_gelu_terms_are_recomputed_in_the_gradient_products_epilogue() -> None:
    """The tanh GELU's terms its gradient reads are cloned apart from its bfloat16 output cloned
    for the weight gradient, and computed in the gradient product's epilogue (no element-wise
    kernel writes them); kernels' numbers: test_kernels_interpreted's "gelu_grad" program."""
    src = """COMPUTE = bfloat16
extern Tensor[float32, 256, 64] X
extern Tensor[float32, 64, 256] W1
extern Tensor[float32, 256, 64] W2
def f(Tensor[float32, 256, 64] x, Tensor[float32, 64, 256] w1, Tensor[float32, 256, 64] w2) -> float32 {
    a = x @ w1
    g = 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
    return sum((g @ w2) * (g @ w2))
}
def main() {
    return grad(f, wrt=(w1, w2))(X, W1, W2)
}
"""
    g = compile_source(src).optimized.main
    s = schedule(g)
    epilogues = [k for k in s.kernels if k.kind == "matmul" and any(g.node(n).op is Op.TANH for n in k.nodes)]
    assert len(epilogues) == 1
    for k in s.kernels:
        if k.kind == "elementwise":
            wide = [n for n in s.outputs(k) if g.node(n).dtype == "float32" and tuple(g.node(n).shape) == (256, 256)]
            assert not wide, [g.node(n).op for n in k.nodes]
