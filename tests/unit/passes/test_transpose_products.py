"""passes/transpose_products.py: a product every reader of which reads it transposed (a tied
table's gradient, [D, V] read as [V, D]) is computed transposed, `bT @ aT`, with the same values;
one read as it is anywhere, or returned, is left alone."""

from __future__ import annotations

import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

# A tied head's table gradient: grad wrt e of `h @ transpose(e)` is transpose(transpose(h) @ g).
TIED = """extern Tensor[float64, T, D] X
extern Tensor[float64, 11, D] E
extern Tensor[float64, T, 11] G
def f(Tensor[float64, 11, D] e, Tensor[float64, T, D] x, Tensor[float64, T, 11] g) -> float64 {
    return sum((x @ transpose(e)) * g)
}
def main() {
    return grad(f, wrt=(e))(E, X, G)
}
"""
# Read transposed after a slice (pad-products' view), and a product also read as it is.
SLICED = """extern Tensor[float64, 5, 7] A
extern Tensor[float64, 7, 9] B
extern Tensor[float64, 9, 9] C
def main() {
    p = A @ B
    q = C @ transpose(B)
    return transpose(p[1:4, 2:8]) * 2.0, transpose(p[:, 0:3]) + 1.0, transpose(q) + 1.0, q[0, 0] * 3.0
}
"""


def _run(g, inputs: dict) -> list[torch.Tensor]:
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    out = CpuExecutor(float64=True, check=False).run(sg, inputs).values
    return [out[i] for i in tree_ids(sg.output)]


def _products(g) -> list:
    return [n for n in g.nodes if n.op is Op.MATMUL]


def test_a_tied_tables_gradient_is_computed_in_the_tables_order() -> None:
    g = compile_source(TIED).optimized.main
    (prod,) = _products(g)
    assert tuple(prod.shape) == (11, "D"), prod.shape
    # no transpose of the product is left: it is the gradient itself
    assert not any(n.op is Op.TRANSPOSE and n.inputs == (prod.id,) for n in g.nodes)
    gen = torch.Generator().manual_seed(1)
    x, e, gr = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((6, 4), (11, 4), (6, 11)))
    (got,) = _run(g, {"X": x, "E": e, "G": gr})
    want = gr.T @ x
    assert float((got - want).norm() / want.norm()) < 1e-12


def test_sliced_reads_swap_their_items_and_a_product_read_as_is_stays() -> None:
    g = compile_source(SLICED).optimized.main
    shapes = sorted(tuple(n.shape) for n in _products(g))
    assert shapes == [(9, 5), (9, 7)], shapes         # p computed as [9, 5]; q read as it is: [9, 7]
    gen = torch.Generator().manual_seed(2)
    a, b, c = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((5, 7), (7, 9), (9, 9)))
    got = _run(g, {"A": a, "B": b, "C": c})
    p, q = a @ b, c @ b.T
    want = [p[1:4, 2:8].T * 2.0, p[:, 0:3].T + 1.0, q.T + 1.0, q[0, 0] * 3.0]
    for x, y in zip(got, want):
        assert x.shape == y.shape
        assert float((x - y).norm() / y.norm()) < 1e-12
