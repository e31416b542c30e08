"""`sink_reshapes`: element-wise chains after a reshape run in the shape of the value they start
from, so that a matmul's activation and residual add become its epilogue (transformers' GPT-2: the
GELU and both residual adds of a block join their matmuls), with the same values everywhere."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import xg
from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.ir.graph import Op


def _kernels_of(engine) -> list:
    sched = schedule(engine.graph)
    g = engine.graph
    return [(k.kind, sorted({g.node(n).op for n in k.nodes}, key=str)) for k in sched.kernels]


def test_gpt2_blocks_fuse_gelu_and_residual_adds_into_their_matmuls() -> None:
    import transformers as T
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=64)
    model = T.GPT2LMHeadModel(cfg).eval()
    model.config.use_cache = False
    ids = torch.randint(0, 97, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(model, example_kwargs={"input_ids": ids}, target="H100", tune="predict").engine
    kernels = _kernels_of(engine)
    matmuls = [ops for kind, ops in kernels if kind == "matmul"]
    # per block: c_attn (+bias), c_proj (+bias +residual), c_fc (+bias, GELU: tanh in the epilogue),
    # c_proj (+bias +residual); then the LM head
    assert len(matmuls) == 4 * 2 + 1
    assert sum(Op.TANH in ops for ops in matmuls) == 2
    per_block_elementwise = [ops for kind, ops in kernels if kind == "elementwise" and Op.TANH in ops]
    assert not per_block_elementwise            # no GELU left outside a matmul
    with torch.no_grad():
        ref = model(input_ids=ids).logits.double()
    got = list(xg.run_engine(engine, {"input_ids": ids}).tensors.values())[0].double()
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_values_are_unchanged_and_only_dense_operands_are_reshaped() -> None:
    src = """
extern Tensor[float32, 2, 3, 4] X
extern Tensor[float32, 4, 5] W
extern Tensor[float32, 2, 3, 5] R
extern Tensor[float32, 2, 5, 3] Q
def main() {
    h = reshape(reshape(X, [6, 4]) @ W, [2, 3, 5])
    a = h * 0.5 + tanh(h * h) + R
    return (a, a + transpose(Q), reshape(a, [6, 5]))
}
"""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.xg"
        path.write_text(src)
        engine = xg.compile_file(path, kernels=False)
    g = engine.graph
    # the chain runs at the product's [B*T, F]; R joins as a view; the transposed Q does not move
    moved = [n for n in g.nodes if n.op is Op.TANH]
    assert moved and len(moved[0].shape) == 2
    adds = [n for n in g.nodes if n.op is Op.ADD and any(g.node(i).op is Op.TRANSPOSE for i in n.inputs)]
    assert adds and len(adds[0].shape) == 3
    assert not any(n.op is Op.RESHAPE and g.node(n.inputs[0]).op is Op.RESHAPE for n in g.nodes)
    rng = np.random.default_rng(3)
    vals = {"X": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 5)),
            "R": rng.standard_normal((2, 3, 5)), "Q": rng.standard_normal((2, 5, 3))}
    t = {k: torch.from_numpy(v) for k, v in vals.items()}
    h = (t["X"].reshape(6, 4) @ t["W"]).reshape(2, 3, 5)
    a = h * 0.5 + torch.tanh(h * h) + t["R"]
    want = (a, a + t["Q"].transpose(1, 2), a.reshape(6, 5))
    got = xg.run_engine(engine, {k: v.astype(np.float32) for k, v in vals.items()}).value
    for w, o in zip(want, got):
        assert tuple(o.shape) == tuple(w.shape)
        assert float((o.double() - w).norm() / w.norm()) < 1e-5


def test_a_program_without_reshapes_is_left_as_it_is() -> None:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.xg"
        path.write_text("extern Tensor[float32, T, D] X\ndef main() {\n    return tanh(X) * 2.0\n}\n")
        prog = xg.compile_file(path, kernels=False)
    g = prog.graph
    assert [n.op for n in g.nodes if n.op not in (Op.INPUT, Op.CONST)] == [Op.TANH, Op.MUL]


def test_the_fused_epilogue_computes_the_same_values_under_the_interpreter() -> None:
    """The generated matmul kernel with the GELU and the residual add as its epilogue, run by
    Triton's interpreter, against float64 torch."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from interpreted import interpreted_report
    report = interpreted_report("interpret_epilogue.py")
    assert report["kinds"] == ["matmul"], report       # one kernel: the product, GELU and residual
    assert report["shape"] == [2, 8, 24] and report["rel_err"] < 1e-5, report


def test_a_batchnorm_after_a_convolution_joins_its_product() -> None:
    """A BatchNorm's per-channel [1, C, 1, 1] operands broadcast against the product [N, C, H*W]
    reshaped to [N, C, H, W] become [1, C, 1]: the normalisation and the ReLU are the convolution
    matmul's epilogue, and the values are those of torch, in float64 under Triton's interpreter."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                                torch.nn.ReLU())
    block[1].running_mean.normal_()
    block[1].running_var.uniform_(0.5, 2.0)
    block = block.eval()
    x = torch.randn(2, 8, 7, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = xg.compile(block, (x,), target="H100", tune="predict")
    kernels = _kernels_of(compiled.engine)
    product = [ops for kind, ops in kernels if kind == "matmul"]
    assert len(product) == 1 and {Op.MUL, Op.RELU} <= set(product[0]), kernels
    assert not any(kind == "elementwise" and Op.RELU in ops for kind, ops in kernels)
    want = block.double()(x.double())
    got = compiled(x)
    assert float((got.double() - want).norm() / want.norm()) < 1e-5


@pytest.mark.parametrize("s, shape, target, want", [
    ((1, 16, 1, 1), (2, 16, 7, 6), (2, 16, 42), (1, 16, 1)),
    ((16, 1, 1), (2, 16, 7, 6), (2, 16, 42), (1, 16, 1)),
    ((1, 1, 7, 1), (2, 16, 7, 6), (2, 16, 42), None),          # varies inside a merged group
    ((6,), (2, 16, 7, 6), (32, 42), None),
    ((1, 16, 1), (2, 16, 42), (2, 16, 7, 6), (1, 16, 1, 1)),   # a split
    ((3, 1), (3, 4), (3, 2, 2), (3, 1, 1)),
])
def test_a_broadcast_operand_follows_the_reshape_only_where_it_is_1_across_the_groups(s, shape, target, want):
    from xgbuild.compiler.passes.sink_reshapes import _broadcast_in
    assert _broadcast_in(s, shape, target) == want


def test_a_broadcast_operand_against_symbolic_sizes_stays_where_it_is():
    from xgbuild.compiler.passes.sink_reshapes import _broadcast_in
    assert _broadcast_in((1, 16, 1), ("B", 16, "T"), ("B", 16, "T", 1)) is None


HEADS = """B = 2
T = 8
H = 3
DH = 4
D = 12
extern Tensor[float32, 16, 36] QKV
extern Tensor[float32, B, H, T, DH] G
def heads(Tensor[float32, 16, D] x) -> Tensor[float32, B, H, T, DH] {
    return transpose(reshape(x, [B, T, H, DH]), dim0=1, dim1=2)
}
def f(Tensor[float32, 16, 36] qkv, Tensor[float32, B, H, T, DH] g) -> float32 {
    q = heads(qkv[:, 0:D])
    k = heads(qkv[:, D:2 * D])
    v = heads(qkv[:, 2 * D:36])
    return sum(q * g) + sum(exp(k * 0.1) * g) + sum(v * v * g)
}
def main() {
    return grad(f, wrt=(qkv))(QKV, G)
}
"""


def test_head_gradients_are_placed_without_merging_copies() -> None:
    """The gradient of attention's head split: each head gradient, [B, H, T, DH] transposed to
    [B, T, H, DH], merged to [N, D] (not a view: a copy) and placed in its third of [N, 3D], is
    placed instead at its index of [B, T, 3, H, DH] read through its strides; the [N, 3D] result
    is a view of that. The values are autograd's."""
    from xgbuild.compiler.driver import compile_source
    from xgbuild.compiler.ir.graph import tree_ids
    from xgbuild.compiler.passes.specialize import bind_symbols, specialize
    from xgbuild.runtime.cpu import CpuExecutor

    g = compile_source(HEADS).optimized.main
    unindex = [n for n in g.nodes if n.op is Op.UNINDEX]
    assert len(unindex) == 3 and all(tuple(n.shape) == (2, 8, 3, 3, 4) for n in unindex)
    assert sorted(n.attr("items")[2] for n in unindex) == [("i", 0), ("i", 1), ("i", 2)]
    merged = [n for n in g.nodes if n.op is Op.RESHAPE and g.node(n.inputs[0]).op is Op.TRANSPOSE]
    assert not merged
    gen = torch.Generator().manual_seed(8)
    qkv = torch.randn(16, 36, generator=gen, dtype=torch.float64)
    gr = torch.randn(2, 3, 8, 4, generator=gen, dtype=torch.float64)
    sg = specialize(g, bind_symbols(g, {"QKV": (16, 36), "G": (2, 3, 8, 4)}))
    out = CpuExecutor(float64=True, check=False).run(sg, {"QKV": qkv, "G": gr}).values
    (got,) = [out[i] for i in tree_ids(sg.output)]
    x = qkv.clone().requires_grad_()

    def heads(t):
        return t.reshape(2, 8, 3, 4).transpose(1, 2)
    q, k, v = heads(x[:, 0:12]), heads(x[:, 12:24]), heads(x[:, 24:36])
    ((q * gr).sum() + (torch.exp(k * 0.1) * gr).sum() + (v * v * gr).sum()).backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-12, atol=1e-12)


def test_an_add_of_a_product_stays_in_the_products_shape() -> None:
    """A training program's residual stream: the first residual is [B, T, D] (a position table
    broadcast over the batch), reshaped to [B*T, D] where each block's product adds to it. The add
    reads the product in its own shape, so it stays there and joins the product's epilogue; the
    [B, T, D] value is read through a view. Moved to [B, T, D], it left both products' epilogues."""
    import tempfile
    from pathlib import Path
    src = """
extern Tensor[float32, 6, 4] E
extern Tensor[float32, 3, 4] P
extern Tensor[float32, 4, 4] W
extern Tensor[float32, 4] BIAS
def main() {
    x = reshape(reshape(E, [2, 3, 4]) + P, [6, 4])
    y = x + (x @ W + BIAS)
    return y + (y @ W)
}
"""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.xg"
        path.write_text(src)
        engine = xg.compile_file(path, kernels=False)
    g = engine.graph
    kernels = _kernels_of(engine)
    assert [kind for kind, _ in kernels] == ["elementwise", "matmul", "matmul"], kernels
    assert all(len(n.shape) == 2 for n in g.nodes if n.op is Op.ADD and g.node(n.inputs[0]).op is not Op.RESHAPE
               and any(g.node(i).op is Op.MATMUL for i in n.inputs))
    rng = np.random.default_rng(5)
    vals = {"E": rng.standard_normal((6, 4)), "P": rng.standard_normal((3, 4)),
            "W": rng.standard_normal((4, 4)), "BIAS": rng.standard_normal(4)}
    t = {k: torch.from_numpy(v) for k, v in vals.items()}
    x = (t["E"].reshape(2, 3, 4) + t["P"]).reshape(6, 4)
    y = x + (x @ t["W"] + t["BIAS"])
    want = y + y @ t["W"]
    got = xg.run_engine(engine, {k: v.astype(np.float32) for k, v in vals.items()}).value
    assert float((got.double() - want).norm() / want.norm()) < 1e-5
