"""passes/fork_casts.py: a widening cast read by several element-wise or row kernels is recomputed
by each instead of being written as the wider dtype and read back (GPT-2's cross-entropy wrote its
[8192, 50257] logits as float32); values are unchanged."""

from __future__ import annotations

import torch

from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.constants import normalize
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

ROWS = """extern Tensor[bfloat16, T, D] X
extern Tensor[float32, D, F] W
def main() {
    x = cast(X, float32)
    return max(x, dim=1), sum(exp(x), dim=1), cast(X, float32) @ W, x * 2.0
}
"""


def _written(g) -> list:
    sched = schedule(g)
    return [g.node(n) for k in sched.kernels for n in sched.outputs(k)]


def test_each_fusable_reader_gets_its_own_cast_and_none_is_written() -> None:
    g = compile_source(ROWS).optimized.main
    users = g.users()
    casts = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "float32"]
    # CSE made one cast of X; the pass gives exp and the doubling their own (the first reader, max,
    # keeps the original, which the product reads too).
    assert len(casts) == 3
    assert sorted(sorted(g.node(u).op.value for u in users[c.id]) for c in casts) == [["exp"], ["matmul", "max"], ["mul"]]
    # Written: only the cast a product reads (a product takes no prologue); exp's and the doubling's
    # kernels start from the bfloat16 X.
    written = [n for n in _written(g) if n.op is Op.CAST]
    assert len(written) == 1 and any(g.node(u).op is Op.MATMUL for u in users[written[0].id])


def test_values_are_unchanged() -> None:
    g = compile_source(ROWS).optimized.main
    gen = torch.Generator().manual_seed(2)
    inputs = {"X": torch.randn(5, 7, generator=gen).bfloat16(), "W": torch.randn(7, 3, generator=gen)}
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    out = CpuExecutor(check=False).run(sg, inputs).values
    got = [out[i] for i in tree_ids(sg.output)]
    x = inputs["X"].float()
    want = [x.amax(dim=1), torch.exp(x).sum(dim=1), x @ inputs["W"], x * 2.0]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_cross_entropy_reads_its_bf16_logits_without_a_float32_copy() -> None:
    """GPT-2's loss: the row kernels over the [N, V] logits each read the bf16 product."""
    c = compile_file("models/train.xg", CheckOptions(consts=normalize({"L": 1, "D": 64, "H": 2, "T": 32, "B": 2})))
    g = c.optimized.main
    sched = schedule(g)
    # (The LM head's weight gradient, [D, V], is a product's float32 output: not this.)
    written = [g.node(n) for k in sched.kernels if k.kind in ("rowwise", "elementwise") for n in sched.outputs(k)]
    wide = [n for n in written if tuple(n.shape) == (64, 50257)]
    assert wide and not any(n.dtype == "float32" for n in wide)
    rows = [k for k in sched.kernels if k.kind == "rowwise" and any(tuple(g.node(i).shape) == (64, 50257)
                                                                     for i in sched.inputs(k))]
    # The row max, the sum of exp(x - max) (the max's epilogue, schedule.row_epilogue) and the
    # target's logit (schedule's row_sibling: the same rows) in one kernel.
    assert len(rows) == 1 and all(g.node(i).dtype == "bfloat16" for k in rows for i in sched.inputs(k)
                                  if tuple(g.node(i).shape) == (64, 50257))
    assert sorted(sum(g.node(n).op.value in ("max", "sum") for n in k.nodes) for k in rows) == [3]


# Two LayerNorms with a product between them, differentiated: autodiff adds each broadcast's
# [T, 1] gradient to a `full(0)` of [T, D], and CSE leaves one such full for every reader.
BROADCASTS = """import std.nn
extern Tensor[float32, T, D] X
extern Tensor[float32, D] G
extern Tensor[float32, D] B
extern Tensor[float32, D, D] W
def f(Tensor[float32, T, D] x, Tensor[float32, D] g, Tensor[float32, D] b, Tensor[float32, D, D] w) -> float32 {
    h = layer_norm(x, g, b) @ w + x
    y = layer_norm(h, g, b) @ w + h
    return sum(y * y)
}
def main() {
    return grad(f, wrt=(x, g, b, w))(X, G, B, W)
}
"""


def test_a_full_read_by_several_kernels_is_recomputed_by_each() -> None:
    """Before: one kernel wrote the [T, D] zeros and the other readers loaded them back."""
    g = compile_source(BROADCASTS).optimized.main
    users = g.users()
    fulls = [n for n in g.nodes if n.op is Op.FULL and n.shape]
    assert len(fulls) >= 5
    assert all(len(users[n.id]) == 1 for n in fulls)
    sched = schedule(g)
    written = [g.node(n) for k in sched.kernels for n in sched.outputs(k)]
    assert not [n for n in written if n.op in (Op.FULL, Op.IOTA) and n.shape]
    # Each copy is in its reader's kernel: no kernel is a source alone.
    assert not [k for k in sched.kernels if all(g.node(n).op in (Op.FULL, Op.IOTA) for n in k.nodes)
                and any(g.node(n).shape for n in k.nodes)]


def test_forked_sources_keep_the_gradients() -> None:
    g = compile_source(BROADCASTS).optimized.main
    gen = torch.Generator().manual_seed(5)
    t, d = 6, 8
    inputs = {"X": torch.randn(t, d, generator=gen, dtype=torch.float64),
              "G": torch.randn(d, generator=gen, dtype=torch.float64),
              "B": torch.randn(d, generator=gen, dtype=torch.float64),
              "W": torch.randn(d, d, generator=gen, dtype=torch.float64) / d ** 0.5}
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    out = CpuExecutor(check=False).run(sg, {k: v.float() for k, v in inputs.items()}).values
    got = [out[i] for i in tree_ids(sg.output)]
    x, gg, b, w = (inputs[k].clone().requires_grad_(True) for k in "XGBW")
    ln = torch.nn.functional.layer_norm
    h = ln(x, (d,), gg, b) @ w + x
    y = ln(h, (d,), gg, b) @ w + h
    want = torch.autograd.grad((y * y).sum(), (x, gg, b, w))
    assert len(got) == 4
    for a, e in zip(got, want):
        assert ((a.double() - e).norm() / e.norm()).item() < 1e-5
