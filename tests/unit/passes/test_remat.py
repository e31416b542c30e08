"""Rematerialisation (passes/remat.py): element-wise values a backward pass reads are computed again
there instead of kept from the forward pass; gradients unchanged (float64, against torch.autograd),
no recomputed value fused into an earlier kernel (but per-row values a few KB in size), bfloat16 element-wise values never recomputed,
and a GPT-2-small training step's peak held memory far lower."""

from __future__ import annotations

import sys
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
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests" / "unit" / "runtime"))
from interpreted import interpreted_report  # noqa: E402
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


# The block at fixed sizes: its [256, 1] per-row values are tiny beside the [256, 64] row kernel.
SIZED_BLOCK = BLOCK.format(dt="float32").replace("T, D]", "256, 64]").replace("D, F]", "64, 128]").replace("F]", "128]")


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


def _clones_in_earlier_kernels(graph) -> tuple[int, list]:
    """(kernels holding recomputed values, [(kernel, clone)] for each clone in a kernel with an
    earlier node that is not a clone)"""
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    checked, early = 0, []
    for k in schedule(graph).kernels:
        re = [x for x in k.nodes if graph.node(x).attr("remat")]
        if re:
            checked += 1
            first = min(position[x] for x in re)
            if any(position[x] < first and not graph.node(x).attr("remat") for x in k.nodes):
                early += [(k, graph.node(x)) for x in re]
    return checked, early


def test_recomputed_values_stay_out_of_earlier_kernels() -> None:
    graph = compile_source(BLOCK.format(dt="float32"), "block.xg").optimized.main
    checked, early = _clones_in_earlier_kernels(graph)
    assert checked and not early, early


def test_tiny_recomputed_values_join_the_forward_kernel(monkeypatch) -> None:
    """GPT-2 small's training step: each LayerNorm's 1 / sqrt(var + eps) and its cube, recomputed
    for the backward pass from the saved variance ([8192, 1], 32 KB), were an element-wise kernel of
    their own (25 launches). Values that small (`schedule.TINY_REMAT` of the kernel's domain) join
    the forward row kernel that has the variance, which writes them; no larger clone moves."""
    from xgbuild.compiler.codegen import schedule as sched
    from xgbuild.compiler.ir.shapes import numel
    graph = compile_source((REPO / "models" / "train.xg").read_text(), "train.xg").optimized.main
    kernels = schedule(graph).kernels
    assert not [k for k in kernels if k.kind == "elementwise" and tuple(k.shape) == (8192, 1)]
    _checked, early = _clones_in_earlier_kernels(graph)
    monkeypatch.setattr(sched, "TINY_REMAT", 0)
    _checked, before = _clones_in_earlier_kernels(graph)
    assert len(kernels) == len(schedule(graph).kernels) - 25
    moved = {n.id for _k, n in early} - {n.id for _k, n in before}
    joined = {id(k): k for k, n in early if n.id in moved}
    assert len(joined) == 25 and all(k.kind == "rowwise" for k in joined.values())
    for k, n in early:
        if n.id in moved:
            assert tuple(n.shape) == (8192, 1) and numel(n.shape) <= numel(k.shape) / 64, (k, n)


def test_tiny_recomputed_values_written_by_the_forward_kernel_match_float64() -> None:
    report = interpreted_report(HERE / "interpret_remat.py")
    assert report["joined"] == ["rowwise"], report
    assert report["errors"] and all(err < 1e-5 for err in report["errors"]), report


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
    probabilities recomputed by its gradient (5.7 GB, then 5.3 GB; torch.compile's measured 8.8).
    The residual adds kept in their products' shape took it to 4.0 GB; values that a clone would
    write for a product, moving more bytes than they free (each layer's weight casts, LayerNorm
    outputs, GELU outputs), kept instead of recomputed: 4.7 GB of 13.4."""
    graph = compile_source((REPO / "models" / "train.xg").read_text(), "train.xg").optimized.main
    _jobs, launches = plan(graph, tuning_env(graph, {}))
    plans = [ExternStep(b) if ident == "extern" else _Plan(b) for ident, b in launches]
    made = made_by(plans)
    kept, dropped = peak_bytes(graph, plans, made, None), peak_bytes(graph, plans, made, frees(graph, plans, made))
    assert dropped < 5e9 and dropped < kept * 0.4, (kept, dropped)


# A tanh-GELU MLP's weight gradients in bfloat16 products; `pre` computes `a_in`, the product's input.
GELU_MLP = """COMPUTE = bfloat16
extern Tensor[float32, 256, 64] X
extern Tensor[float32, 64, 256] W1
extern Tensor[float32, 256, 64] W2
def f(Tensor[float32, 256, 64] x, Tensor[float32, 64, 256] w1, Tensor[float32, 256, 64] w2) -> float32 {{
    {pre}a = {a_in} @ w1
    g = 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
    return sum((g @ w2) * (g @ w2))
}}
def main() {{
    return grad(f, wrt=(w1, w2))(X, W1, W2)
}}
"""


def test_gelu_terms_are_recomputed_in_one_kernel_with_the_gelu_gradient() -> None:
    """The tanh GELU's terms its gradient reads are recomputed in the kernel that applies them to
    the gradient product's output, never written: an element-wise kernel, since the 40-odd ops
    are over schedule.MAX_EPILOGUE (in the product's epilogue they spilled: 0.214 ms against
    0.06 + 0.05 on an H200); kernels' numbers: test_kernels_interpreted's "gelu_grad" program."""
    g = compile_source(GELU_MLP.format(pre="", a_in="x")).optimized.main
    s = schedule(g)
    assert not any(g.node(n).op is Op.TANH for k in s.kernels if k.kind == "matmul" for n in k.nodes)
    (backward,) = [k for k in s.kernels if any(g.node(n).op is Op.TANH and g.node(n).attr("remat") for n in k.nodes)]
    assert backward.kind == "elementwise"
    assert any(g.node(n).op is Op.MATMUL for i in s.inputs(backward) for n in [i])
    assert [g.node(n).dtype for n in s.outputs(backward)] == ["bfloat16"]


def test_a_value_only_products_read_again_is_kept_not_recomputed() -> None:
    """A clone a product reads is written to memory by a kernel of its own: for the weights' and
    the normalised rows' bfloat16 copies that kernel moves more bytes (the float32 value read, the
    copy written) than keeping the copy holds, so they are kept. The GELU's float32 terms, fused
    into the gradient product's epilogue, are still recomputed."""
    g = compile_source(GELU_MLP.format(pre="h = x * rsqrt(mean(x * x, dim=1, keepdim=true) + 1e-5)\n    ",
                                       a_in="h")).optimized.main
    clones = [n for n in g.nodes if n.attr("remat")]
    assert any(n.op is Op.TANH for n in clones)
    users = g.users()
    for n in clones:
        read_by = {g.node(u).op for u in users.get(n.id, ())}
        assert not (n.op is Op.CAST and n.dtype == "bfloat16" and read_by <= {Op.MATMUL, Op.TRANSPOSE}), n
    # Each weight is cast once, read by its forward product and its backward one.
    narrow = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "bfloat16" and g.node(n.inputs[0]).op is Op.INPUT]
    assert len(narrow) == 2, narrow
