"""passes/precision.py: the mixed-precision policy (`COMPUTE = bfloat16`) on the IR: float32 products
get operands cast to the compute dtype and a result cast back; the backward products autodiff
derives from them compute in it too; other products, inputs and outputs keep their dtypes; the
gradients match PyTorch's through the same casts."""

import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.constants import normalize
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.runtime.cpu import CpuExecutor

SRC = """COMPUTE = bfloat16
extern Tensor[float32, 8, 16] X
extern Tensor[float32, 16, 12] W1
extern Tensor[float32, 12, 4] W2
extern Tensor[float64, 4, 4] Q
def f(Tensor[float32, 8, 16] x, Tensor[float32, 16, 12] w1, Tensor[float32, 12, 4] w2) -> float32 {
    h = tanh(x @ w1)
    z = h @ w2
    return mean(softmax(z, dim=1) * z)
}
def main() {
    (l, g) = value_and_grad(f, wrt=(w1, w2))(X, W1, W2)
    return (l, g, Q @ Q)
}
"""


def compiled(consts: dict | None = None, src: str = SRC):
    return compile_source(src, "p.xg", CheckOptions(consts=normalize(consts or {})), verify_each=True)


def inputs(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"X": torch.randn(8, 16, generator=gen), "W1": torch.randn(16, 12, generator=gen) / 4,
            "W2": torch.randn(12, 4, generator=gen) / 3, "Q": torch.randn(4, 4, generator=gen, dtype=torch.float64)}


def test_float32_products_compute_in_the_policy_dtype_forward_and_backward() -> None:
    g = compiled().optimized.main
    products = [n for n in g.nodes if n.op is Op.MATMUL]
    by_dtype = {d: [n for n in products if n.dtype == d] for d in ("bfloat16", "float32", "float64")}
    # x @ w1 and h @ w2 forward; the gradients of w1 (one product) and of w2 and h (two).
    assert len(by_dtype["bfloat16"]) == 5 and not by_dtype["float32"]
    assert all(g.node(i).dtype == "bfloat16" for n in by_dtype["bfloat16"] for i in n.inputs)
    assert len(by_dtype["float64"]) == 1          # written in float64: left as written, as autocast does
    assert [g.node(i).dtype for i in tree_ids(g.output)] == ["float32", "float32", "float32", "float64"]
    assert {g.node(i).dtype for _, i in g.inputs} == {"float32", "float64"}
    # Nothing but the products and the casts around them is in bfloat16 (softmax, mean, tanh: float32).
    assert {n.op for n in g.nodes if n.dtype == "bfloat16"} <= {Op.MATMUL, Op.CAST, Op.TRANSPOSE, Op.RESHAPE}


def test_no_policy_and_float32_leave_the_program_as_written() -> None:
    written = compiled(src=SRC.replace("COMPUTE = bfloat16", "# no policy"))   # the same lines
    overridden = compiled({"COMPUTE": "float32"})
    assert written.lowered == overridden.lowered
    assert not any(n.dtype == "bfloat16" for n in overridden.optimized.main.nodes)
    assert overridden.typed.compute is None and overridden.lowered.compute is None


def test_an_override_states_the_policy_for_a_file_without_one() -> None:
    c = compiled({"COMPUTE": "float16"}, src=SRC.replace("COMPUTE = bfloat16\n", ""))
    assert c.lowered.compute == "float16"
    assert {n.dtype for n in c.optimized.main.nodes if n.op is Op.MATMUL} == {"float16", "float64"}


def torch_reference(x: dict, dtype) -> tuple:
    """f by hand in PyTorch, each product's operands cast to `dtype` and its result back to float32
    (`dtype` None: float32 throughout); autograd takes the gradients through the casts."""
    w1, w2 = x["W1"].clone().requires_grad_(), x["W2"].clone().requires_grad_()

    def mm(a, b):
        return a @ b if dtype is None else (a.to(dtype) @ b.to(dtype)).float()
    h = torch.tanh(mm(x["X"], w1))
    z = mm(h, w2)
    loss = (torch.softmax(z, dim=1) * z).mean()
    loss.backward()
    return loss.detach(), w1.grad, w2.grad


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_gradients_flow_through_the_casts_as_in_pytorch() -> None:
    """The derivative of a cast is a cast back: XG's gradients under the policy are PyTorch's
    through the same casts: the same bfloat16 roundings in the same places (they agree bit for bit
    on this CPU; 1e-6 allows another summation order), where float32 gradients differ from them by
    bfloat16's noise (3e-3 to 8e-3 here)."""
    run = CpuExecutor(check=True)
    for seed in range(3):
        x = inputs(seed)
        graph = compiled().optimized.main
        out = run.run(graph, x).values
        loss, g1, g2, _ = (out[i] for i in tree_ids(graph.output))
        want = torch_reference(x, torch.bfloat16)
        plain = torch_reference(x, None)
        assert _rel(loss, want[0]) < 1e-6
        for got, ref, f32 in ((g1, want[1], plain[1]), (g2, want[2], plain[2])):
            assert got.dtype == torch.float32
            assert _rel(got, ref) < 1e-6 and _rel(got, f32) > 1e-3, (seed, _rel(got, ref), _rel(got, f32))
