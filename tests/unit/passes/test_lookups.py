"""passes/lookups.py: a one-hot product (std.nn's `embed`) runs as a table lookup with the same
values, out-of-range indices included, and its gradient's product as a scatter-add; a cast of a transposed value read by products is cast
before the transpose (one cast of a tied table, read as stored)."""

from __future__ import annotations

import pytest
import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

EMBED = """import std.nn
extern Tensor[int64, T] I
extern Tensor[float64, 13, D] E
extern Tensor[float64, T, D] G
def rows(Tensor[int64, T] i, Tensor[float64, 13, D] e) -> Tensor[float64, T, D] {
    onehot = cast(reshape(i, [T, 1]) == reshape(arange(13), [1, 13]), float64)
    return onehot @ e
}
def f(Tensor[int64, T] i, Tensor[float64, 13, D] e, Tensor[float64, T, D] g) -> float64 {
    return sum(rows(i, e) * g)
}
def main() {
    return rows(I, E), grad(f, wrt=(e))(I, E, G)
}
"""

TIED = """import std.nn
COMPUTE = bfloat16
extern Tensor[float32, T, D] X
extern Tensor[int64, T] I
extern Tensor[float32, 11, D] E
def f(Tensor[int64, T] i, Tensor[float32, 11, D] e, Tensor[float32, T, D] x) -> float32 {
    h = embed(i, e) + x
    return sum((h @ transpose(e)) * (h @ transpose(e)))
}
def main() {
    return grad(f, wrt=(e))(I, E, X)
}
"""


def _run(g, inputs: dict) -> list[torch.Tensor]:
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    out = CpuExecutor(float64=True, check=False).run(sg, inputs).values
    return [out[i] for i in tree_ids(sg.output)]


def _users(g, nid: int) -> list:
    return [n for n in g.nodes if nid in n.inputs]


def test_one_hot_product_is_a_lookup_with_the_same_values() -> None:
    g = compile_source(EMBED).optimized.main
    # The forward reads rows of the table; the gradient adds rows into it; no one-hot is left.
    assert any(n.op is Op.GATHER for n in g.nodes)
    assert [n.attr("rows") for n in g.nodes if n.op is Op.SCATTER_ADD] == [13]
    assert not any(n.op in (Op.MATMUL, Op.EQ, Op.IOTA) for n in g.nodes)
    gen = torch.Generator().manual_seed(11)
    V, D, T = 13, 6, 40
    # Indices in range, and out of it on both sides: those rows are zeros, as the product gives.
    idx = torch.randint(-3, V + 3, (T,), generator=gen)
    idx[:2] = torch.tensor([-1, V])
    e = torch.randn(V, D, generator=gen, dtype=torch.float64)
    gr = torch.randn(T, D, generator=gen, dtype=torch.float64)
    rows, grad = _run(g, {"I": idx, "E": e, "G": gr})
    onehot = (idx[:, None] == torch.arange(V)[None, :]).double()
    assert torch.equal(rows, onehot @ e)
    assert rows[0].abs().sum() == 0 and rows[1].abs().sum() == 0
    torch.testing.assert_close(grad, onehot.T @ gr, rtol=1e-12, atol=1e-14)


def test_a_product_that_is_not_one_hot_stays_a_product() -> None:
    src = """extern Tensor[int64, T] I
extern Tensor[int64, T] J
extern Tensor[float32, T, D] E
def main() {
    return cast(reshape(I, [T, 1]) == reshape(J, [1, T]), float32) @ E
}
"""
    g = compile_source(src).optimized.main
    assert not any(n.op is Op.GATHER for n in g.nodes)
    assert any(n.op is Op.MATMUL for n in g.nodes)


def test_tied_table_is_cast_once_and_read_as_stored() -> None:
    g = compile_source(TIED).optimized.main
    table = next(n.id for n in g.nodes if n.op is Op.INPUT and n.attr("name") == "E")
    casts = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "bfloat16"]
    # No bfloat16 copy of the transposed table: every cast reads the table as stored.
    assert not any(g.node(c.inputs[0]).op is Op.TRANSPOSE for c in casts)
    assert len([c for c in casts if c.inputs[0] == table and not c.attr("remat", 0)]) == 1
    products = [n for n in g.nodes if n.op is Op.MATMUL]
    assert products and all(g.node(i).dtype == "bfloat16" for n in products for i in n.inputs)
    # The embedding's gradient adds the bfloat16 rows, as the product it replaces read them.
    (scatter,) = [n for n in g.nodes if n.op is Op.SCATTER_ADD]
    assert scatter.dtype == "bfloat16" and scatter.attr("rows") == 11
    # The values: float32 master table, bfloat16 products, against autograd under autocast rules.
    gen = torch.Generator().manual_seed(5)
    V, D, T = 11, 8, 16
    x = torch.randn(T, D, generator=gen)
    idx = torch.randint(0, V, (T,), generator=gen)
    e = torch.randn(V, D, generator=gen)
    (grad,) = _run(g, {"X": x, "I": idx, "E": e})
    er = e.double().requires_grad_()
    h = er[idx] + x.double()
    ((h @ er.T) ** 2).sum().backward()
    assert ((grad.double() - er.grad).norm() / er.grad.norm()).item() < 2e-2


def test_a_cast_of_a_transpose_read_element_wise_is_left() -> None:
    src = """extern Tensor[float32, D, T] W
def main() {
    return cast(transpose(W), bfloat16) * 2.0
}
"""
    g = compile_source(src).optimized.main
    cast = next(n for n in g.nodes if n.op is Op.CAST)
    assert g.node(cast.inputs[0]).op is Op.TRANSPOSE


def test_scatter_add_drops_out_of_range_indices_and_sums_in_order() -> None:
    """The gradient of a lookup whose indices run past the table on both sides: those rows add
    nothing, as the one-hot's rows of zeros did; repeated indices sum."""
    g = compile_source(EMBED).optimized.main
    gen = torch.Generator().manual_seed(3)
    V, D, T = 13, 5, 64
    idx = torch.randint(-4, V + 4, (T,), generator=gen)
    idx[:3] = torch.tensor([V - 1, V - 1, -1])
    e = torch.randn(V, D, generator=gen, dtype=torch.float64)
    gr = torch.randn(T, D, generator=gen, dtype=torch.float64)
    _rows, grad = _run(g, {"I": idx, "E": e, "G": gr})
    onehot = (idx[:, None] == torch.arange(V)[None, :]).double()
    torch.testing.assert_close(grad, onehot.T @ gr, rtol=1e-12, atol=1e-14)


def test_scatter_add_shape_rule_names_what_is_wrong() -> None:
    from xgbuild.compiler.ir.graph import Node, attrs_of
    from xgbuild.compiler.ops import ShapeError, op_def

    rule = op_def(Op.SCATTER_ADD).infer
    node = Node(0, Op.SCATTER_ADD, (1, 2), "", (), attrs_of(rows=7))
    assert rule(node, [("int64", (5,)), ("float32", (5, 3))]) == ("float32", (7, 3))
    for ins, words in ((("float32", (5,)), ("float32", (5, 3))), "integer indices"), \
            ((("int64", (5,)), ("int64", (5, 3))), "floating-point rows"), \
            ((("int64", (4,)), ("float32", (5, 3))), "one index per row"):
        with pytest.raises(ShapeError, match=words):
            rule(node, list(ins))
    for rows in (0, "V", True):
        with pytest.raises(ShapeError, match="positive static row count"):
            rule(Node(0, Op.SCATTER_ADD, (1, 2), "", (), attrs_of(rows=rows)), [("int64", (5,)), ("float32", (5, 3))])
