"""`stop_gradient(x)`: x's values, a constant to autodiff (no gradient flows through it), gone from
the optimised IR (simplify drops it once gradients are taken)."""

from __future__ import annotations

import pytest
import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.errors import CompileError
from xgbuild.runtime.cpu import CpuExecutor

SRC = """extern Tensor[float64, T, V] X
def f(Tensor[float64, T, V] x) -> float64 {
    m = stop_gradient(max(x, dim=1, keepdim=true))
    return sum(m + log(sum(exp(x - m), dim=1, keepdim=true))) + sum(stop_gradient(x * x))
}
def main() {
    return value_and_grad(f, wrt=(x))(X)
}
"""


def test_no_gradient_flows_and_the_op_is_gone() -> None:
    g = compile_source(SRC).optimized.main
    assert not any(n.op is Op.STOP_GRADIENT for n in g.nodes)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    sg = specialize(g, bind_symbols(g, {"X": (5, 7)}))
    out = CpuExecutor(float64=True, check=False).run(sg, {"X": x}).values
    value, grad = (out[i] for i in tree_ids(sg.output))
    xr = x.clone().requires_grad_()
    want = torch.logsumexp(xr, 1).sum() + (xr * xr).detach().sum()
    want.backward()
    assert torch.allclose(value, want.detach(), rtol=1e-12)
    # The shift's gradient terms cancel; x * x contributes none: softmax rows.
    assert torch.allclose(grad, xr.grad, rtol=1e-12, atol=1e-14)


def test_it_is_a_builtin_with_one_argument() -> None:
    with pytest.raises(CompileError, match="stop_gradient"):
        compile_source("extern Tensor[float32, N] X\ndef main() {\n    return stop_gradient(X, X)\n}\n")
    g = compile_source("extern Tensor[float32, N] X\ndef main() {\n    return stop_gradient(X) * 2.0\n}\n").optimized.main
    assert [n.op for n in g.nodes if n.op not in (Op.INPUT, Op.CONST)] == [Op.MUL]
