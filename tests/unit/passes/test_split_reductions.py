"""`split_reductions`: a whole-tensor reduction of rank >= 2 becomes a reduction of each last-dim
row, then of the rows' results, so it runs on every SM instead of one program; the values are the
float64 reference's (the kernels themselves under Triton's interpreter: test_kernels_interpreted's
"split_reductions" program)."""

from __future__ import annotations

import pytest
import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

SRC = """extern Tensor[float32, 12, 96, 80] X
extern Tensor[int64, 300, 256] I
extern Tensor[bfloat16, 300, 256] H
extern Tensor[float32, T, D] S
extern Tensor[float32, 4096] R
extern Tensor[float32, 2, 40000] W
def main() {
    return sum(X * X), mean(X, keepdim=true), max(X), min(I), sum(H), sum(S), sum(R), sum(W), sum(X, dim=2)
}
"""


def _reductions(g) -> list:
    return [n for n in g.nodes if n.op in (Op.SUM, Op.MEAN, Op.MAX, Op.MIN)]


def test_whole_tensor_reductions_split_into_rows_then_one() -> None:
    g = compile_source(SRC).optimized.main
    outs = [g.node(i) for i in _out_ids(g)]
    split = {}
    for o in outs:
        x = g.node(o.inputs[0]) if o.inputs else None
        split[len(split)] = x is not None and x.op is o.op and x.attr("dim") is not None and o.attr("dim") is None
    # X's three reductions and I's min split; bfloat16, symbolic, rank-1, too-few-rows and
    # already-dimensioned reductions stay one op
    assert [split[k] for k in range(9)] == [True, True, True, True, False, False, False, False, False]
    x_sum = g.node(outs[0].inputs[0])
    assert tuple(x_sum.shape) == (12, 96) and x_sum.attr("dim") == 2 and x_sum.dtype == "float32"
    mean_rows = g.node(outs[1].inputs[0])
    assert tuple(mean_rows.shape) == (12, 96, 1) and tuple(outs[1].shape) == (1, 1, 1)


def _out_ids(g) -> list[int]:
    from xgbuild.compiler.ir.graph import tree_ids
    return tree_ids(g.output)


@pytest.mark.parametrize("seed", [0, 1])
def test_split_values_match_float64(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    inputs = {"X": torch.randn(12, 96, 80, generator=gen), "I": torch.randint(-10**6, 10**6, (300, 256), generator=gen),
              "H": torch.randn(300, 256, generator=gen).bfloat16(), "S": torch.randn(7, 5, generator=gen),
              "R": torch.randn(4096, generator=gen), "W": torch.randn(2, 40000, generator=gen)}
    g = compile_source(SRC).optimized.main
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    got = CpuExecutor(check=False).run(sg, inputs).values
    values = [got[i] for i in _out_ids(sg)]
    x = inputs["X"].double()
    want = [(x * x).sum(), x.mean().reshape(1, 1, 1), x.max(), inputs["I"].min(),
            inputs["H"].double().sum(), inputs["S"].double().sum(), inputs["R"].double().sum(),
            inputs["W"].double().sum(), x.sum(2)]
    for k, (have, ref) in enumerate(zip(values, want)):
        assert tuple(have.shape) == tuple(ref.shape), k
        if ref.dtype == torch.int64:
            assert torch.equal(have, ref), k
            continue
        err = ((have.double() - ref).abs().max() / ref.abs().max()).item()
        assert err < (2e-2 if k == 4 else 1e-5), (k, err)


COLUMNS = """extern Tensor[float32, 4096, 96] G
extern Tensor[float32, 3, 2048, 5] Y
extern Tensor[float32, 1000, 96] SHORT
extern Tensor[float32, 4000, 96] ODD
extern Tensor[bfloat16, 4096, 96] H
def main() {
    return (sum(G * 2.0, dim=0), mean(Y * 1.0, dim=1, keepdim=true), max(Y * 1.0, dim=-2), sum(SHORT * 2.0, dim=0),
            sum(ODD * 2.0, dim=0), sum(H * H, dim=0), sum(G * 2.0, dim=1))
}
"""


def test_strided_reductions_split_into_runs_then_the_rest() -> None:
    """A long reduction along a dim other than the last reduces runs of 64 first (through a view
    [R / 64, 64, ...]), then the run results; short, non-multiple-of-64, 16-bit and last-dim
    reductions stay one op. The values are the float64 reference's."""
    g = compile_source(COLUMNS).optimized.main
    outs = [g.node(i) for i in _out_ids(g)]

    def staged(o) -> bool:
        x = g.node(o.inputs[0])
        return x.op is o.op and g.node(x.inputs[0]).op is Op.RESHAPE

    assert [staged(o) for o in outs] == [True, True, True, False, False, False, False]
    runs = g.node(outs[0].inputs[0])
    assert tuple(runs.shape) == (64, 96) and tuple(g.node(runs.inputs[0]).shape) == (64, 64, 96)
    assert tuple(outs[1].shape) == (3, 1, 5) and tuple(g.node(outs[1].inputs[0]).shape) == (3, 32, 5)
    gen = torch.Generator().manual_seed(7)
    inputs = {"G": torch.randn(4096, 96, generator=gen), "Y": torch.randn(3, 2048, 5, generator=gen),
              "SHORT": torch.randn(1000, 96, generator=gen), "ODD": torch.randn(4000, 96, generator=gen),
              "H": torch.randn(4096, 96, generator=gen).bfloat16()}
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    got = CpuExecutor(float64=True, check=False).run(sg, inputs).values
    gd, y = inputs["G"].double(), inputs["Y"].double()
    want = [(2 * gd).sum(0), y.mean(1, keepdim=True), y.max(1).values]
    for have, ref in zip([got[i] for i in _out_ids(sg)][:3], want):
        assert tuple(have.shape) == tuple(ref.shape)
        torch.testing.assert_close(have.double(), ref, rtol=1e-12, atol=1e-12)


def test_a_reshape_of_a_kernels_value_splits_and_a_transpose_does_not() -> None:
    """A reduction of a reshape of a value a kernel made (the fused qkv bias gradient, read as
    [N, 3D] from its [B, T, 3, H, DH] sum) splits as that value would: its [R / 64, 64, ...]
    reshape is a view too. A transpose's is not, so a reduction of one stays one op."""
    src = """extern Tensor[float32, 8, 512, 3, 4, 16] X
extern Tensor[float32, 192, 4096] Y
def main() {
    return sum(reshape(X * 2.0, [4096, 192]), dim=0), sum(transpose(Y * 2.0), dim=0)
}
"""
    g = compile_source(src).optimized.main
    split, whole = (g.node(i) for i in _out_ids(g))
    first = g.node(split.inputs[0])
    assert first.op is Op.SUM and tuple(first.shape) == (64, 192)
    assert tuple(g.node(first.inputs[0]).shape) == (64, 64, 192)
    assert g.node(whole.inputs[0]).op is Op.TRANSPOSE
    gen = torch.Generator().manual_seed(3)
    inputs = {"X": torch.randn(8, 512, 3, 4, 16, generator=gen), "Y": torch.randn(192, 4096, generator=gen)}
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    got = [CpuExecutor(float64=True, check=False).run(sg, inputs).values[i] for i in _out_ids(sg)]
    torch.testing.assert_close(got[0], (2 * inputs["X"].double()).reshape(4096, 192).sum(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], (2 * inputs["Y"].double()).T.sum(0), rtol=1e-12, atol=1e-12)


LN_GRAD = """extern Tensor[bfloat16, 2048, 96] DY
extern Tensor[float32, 2048, 96] X
extern Tensor[float32, 2048, 1] M
extern Tensor[float32, 2048, 1] R
def main() {
    dy = cast(DY, float32)
    return sum(dy * ((X - M) * R), dim=0), sum(dy, dim=0)
}
"""


def _ln_inputs(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"DY": torch.randn(2048, 96, generator=gen).bfloat16(), "X": torch.randn(2048, 96, generator=gen),
            "M": torch.randn(2048, 1, generator=gen), "R": torch.rand(2048, 1, generator=gen) + 0.5}


def test_element_wise_ops_only_a_strided_reduction_reads_are_rebuilt_in_its_split_shape() -> None:
    """LayerNorm's weight gradient: the product of dy and the normalised input is rebuilt in the
    [R / 64, 64, D] shape over views of its inputs (the [R, 1] statistics split too, the weights
    would broadcast as they are), so nothing of [R, D] is left to write; the values are float64's."""
    g = compile_source(LN_GRAD).optimized.main
    weight, bias = (g.node(i) for i in _out_ids(g))
    first = g.node(weight.inputs[0])
    assert first.op is Op.SUM and tuple(first.shape) == (32, 96) and first.attr("dim") == 1
    product = g.node(first.inputs[0])
    assert product.op is Op.MUL and tuple(product.shape) == (32, 64, 96)
    inputs = {n.id for n in g.nodes if n.op is Op.INPUT}
    big = [n for n in g.nodes if tuple(n.shape) == (2048, 96) and n.id not in inputs]
    assert big == []
    views = {tuple(n.shape) for n in g.nodes if n.op is Op.RESHAPE}
    assert views == {(32, 64, 96), (32, 64, 1)}
    for seed in (0, 1):
        inputs = _ln_inputs(seed)
        sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
        got = [CpuExecutor(float64=True, check=False).run(sg, inputs).values[i] for i in _out_ids(sg)]
        dy, x = inputs["DY"].double(), inputs["X"].double()
        want = [(dy * ((x - inputs["M"].double()) * inputs["R"].double())).sum(0), dy.sum(0)]
        for have, ref in zip(got, want):
            torch.testing.assert_close(have.double(), ref, rtol=1e-12, atol=1e-12)


def test_both_first_stages_of_one_gradient_share_a_kernel_with_their_prologues() -> None:
    from xgbuild.compiler.codegen.schedule import schedule
    g = compile_source(LN_GRAD).optimized.main
    s = schedule(g)
    strided = [k for k in s.kernels if k.kind == "rowwise" and tuple(k.shape) == (32, 64, 96)]
    assert len(strided) == 1 and sum(g.node(i).op is Op.SUM for i in strided[0].nodes) == 2
    assert all(k.kind == "rowwise" for k in s.kernels)        # no element-wise kernel writes the product
    assert sorted(g.node(i).dtype for i in s.inputs(strided[0])) == ["bfloat16"] * 2 + ["float32"] * 3


def test_a_product_read_elsewhere_is_split_through_a_view_of_it() -> None:
    src = LN_GRAD.replace("return sum(dy * ((X - M) * R), dim=0), sum(dy, dim=0)",
                          "p = dy * ((X - M) * R)\n    return sum(p, dim=0), p")
    g = compile_source(src).optimized.main
    weight = g.node(_out_ids(g)[0])
    first = g.node(weight.inputs[0])
    view = g.node(first.inputs[0])
    assert view.op is Op.RESHAPE and tuple(g.node(view.inputs[0]).shape) == (2048, 96)



CAST_READ = """extern Tensor[bfloat16, 2048, 96] A
extern Tensor[float32, 96] B
extern Tensor[bfloat16, 96, 32] W
def main() {
    d = tanh(cast(A, float32) + B) * B
    y = cast(d, bfloat16) @ W
    return y, sum(d, dim=0)
}
"""


def test_a_value_read_by_its_casts_is_rebuilt_and_the_casts_are_views_of_the_split_ones() -> None:
    """The MLP's bias gradient: the summed value is read by the sum and by its bfloat16 cast, which
    the products read (here before the sum, in program order). The ops and the cast are rebuilt in
    the [R / 64, 64, D] shape, the cast's readers read a view of the split cast, and no float32
    [R, D] value is left to write; the values are float64's."""
    g = compile_source(CAST_READ).optimized.main
    product, bias = (g.node(i) for i in _out_ids(g))
    first = g.node(bias.inputs[0])
    assert first.op is Op.SUM and tuple(first.shape) == (32, 96) and first.attr("dim") == 1
    inputs = {n.id for n in g.nodes if n.op is Op.INPUT}
    big = [(n.op, n.dtype) for n in g.nodes if tuple(n.shape) == (2048, 96) and n.id not in inputs]
    assert big == [(Op.RESHAPE, "bfloat16")]
    view = next(n for n in g.nodes if tuple(n.shape) == (2048, 96) and n.id not in inputs)
    cast = g.node(view.inputs[0])
    assert cast.op is Op.CAST and tuple(cast.shape) == (32, 64, 96) and cast.inputs[0] == first.inputs[0]
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        inputs = {"A": torch.randn(2048, 96, generator=gen).bfloat16(), "B": torch.randn(96, generator=gen),
                  "W": torch.randn(96, 32, generator=gen).bfloat16()}
        sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
        got = [CpuExecutor(float64=True, check=False).run(sg, inputs).values[i] for i in _out_ids(sg)]
        a, b = inputs["A"].double(), inputs["B"].double()
        d = torch.tanh(a + b) * b
        want = [d @ inputs["W"].double(), d.sum(0)]       # (casts are the identity in float64 mode)
        for have, ref in zip(got, want):
            torch.testing.assert_close(have.double(), ref, rtol=1e-12, atol=1e-12)


def test_a_value_read_by_a_cast_and_something_else_is_split_through_a_view_of_it() -> None:
    src = CAST_READ.replace("return y, sum(d, dim=0)", "return y, sum(d, dim=0), d + 1.0")
    g = compile_source(src).optimized.main
    first = g.node(g.node(_out_ids(g)[1]).inputs[0])
    view = g.node(first.inputs[0])
    assert view.op is Op.RESHAPE and tuple(g.node(view.inputs[0]).shape) == (2048, 96)
