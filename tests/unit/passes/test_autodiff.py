"""Gradient checks: every differentiable builtin against torch.autograd and against central
differences, in float64, on fresh random inputs (relative error under 1e-6)."""

import numpy as np
import pytest
import torch

from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_source
from xgbuild.errors import CompileError

# (name, XG expression of x [and y], torch function, domain of x) — shapes: x [4, 5], y [4, 5]
CASES = [
    ("add", "x + y", lambda x, y: x + y, "any"),
    ("sub_broadcast", "x - b", lambda x, y, b: x - b, "any"),
    ("mul", "x * y", lambda x, y: x * y, "any"),
    ("square", "x * x", lambda x, y: x * x, "any"),
    ("div", "x / (y * y + 0.5)", lambda x, y: x / (y * y + 0.5), "any"),
    ("neg", "-x", lambda x, y: -x, "any"),
    ("exp", "exp(x)", lambda x, y: torch.exp(x), "any"),
    ("log", "log(x)", lambda x, y: torch.log(x), "pos"),
    ("sqrt", "sqrt(x)", lambda x, y: torch.sqrt(x), "pos"),
    ("rsqrt", "rsqrt(x * x + 0.1)", lambda x, y: torch.rsqrt(x * x + 0.1), "any"),
    ("sigmoid", "sigmoid(x)", lambda x, y: torch.sigmoid(x), "any"),
    ("tanh", "tanh(x)", lambda x, y: torch.tanh(x), "any"),
    ("gelu", "gelu(x)", lambda x, y: torch.nn.functional.gelu(x), "any"),
    ("silu", "silu(x)", lambda x, y: torch.nn.functional.silu(x), "any"),
    ("relu", "relu(x)", lambda x, y: torch.relu(x), "nonzero"),
    ("abs", "abs(x)", lambda x, y: torch.abs(x), "nonzero"),
    ("erf", "erf(x)", lambda x, y: torch.erf(x), "any"),
    ("maximum", "maximum(x, y)", lambda x, y: torch.maximum(x, y), "any"),
    ("minimum", "minimum(x, y)", lambda x, y: torch.minimum(x, y), "any"),
    ("where", "where(x > y, x * 2.0, y * y)", lambda x, y: torch.where(x > y, x * 2.0, y * y), "any"),
    ("sum_dim", "sum(x * y, dim=1, keepdim=true) * x", lambda x, y: (x * y).sum(1, keepdim=True) * x, "any"),
    ("sum_nokeep", "sum(x, dim=0) * b", lambda x, y, b: x.sum(0) * b, "any"),
    ("mean_dim", "mean(x * y, dim=1, keepdim=true) * x", lambda x, y: (x * y).mean(1, keepdim=True) * x, "any"),
    ("mean_all", "mean(x * y) * x", lambda x, y: (x * y).mean() * x, "any"),
    ("max_dim", "max(x, dim=1, keepdim=true) * y", lambda x, y: x.amax(1, keepdim=True) * y, "any"),
    ("min_dim", "min(x, dim=0) * b", lambda x, y, b: x.amin(0) * b, "any"),
    ("softmax", "softmax(x, dim=1) * y", lambda x, y: torch.softmax(x, 1) * y, "any"),
    ("log_softmax", "log_softmax(x, dim=0) * y", lambda x, y: torch.log_softmax(x, 0) * y, "any"),
    ("transpose", "transpose(x) @ y", lambda x, y: x.T @ y, "any"),
    ("matmul", "x @ transpose(y)", lambda x, y: x @ y.T, "any"),
    ("matvec", "x @ b", lambda x, y, b: x @ b, "any"),
    ("reshape", "reshape(x, [5, 4]) @ y", lambda x, y: x.reshape(5, 4) @ y, "any"),
    ("index", "x[1] * y[2, :] + x[:, 1:3][0, 1]", lambda x, y: x[1] * y[2, :] + x[:, 1:3][0, 1], "any"),
    ("cast", "cast(cast(x, float32), float64) * y", lambda x, y: x.float().double() * y, "any"),
    ("stable_softmax", "exp(x - max(x, dim=1, keepdim=true)) / sum(exp(x - max(x, dim=1, keepdim=true)), dim=1, keepdim=true)",
     lambda x, y: torch.softmax(x, 1), "any"),
    ("rmsnorm", "x * rsqrt(mean(x * x, dim=1, keepdim=true) + 1e-5) * b",
     lambda x, y, b: x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-5) * b, "any"),
]


def _program(expr: str, out_shape: tuple) -> str:
    dims = ", ".join(str(d) for d in out_shape)
    return (f"def f(Tensor[float64, 4, 5] x, Tensor[float64, 4, 5] y, Tensor[float64, 5] b, "
            f"Tensor[float64, {dims}] r) -> float64 {{\n"
            f"    return sum(({expr}) * r)\n}}\n"
            "def main() {\n    return value_and_grad(f, wrt=(x, y, b))(X, Y, Bv, Rw)\n}\n")


def _inputs(rng: np.random.Generator, domain: str, out_shape: tuple) -> dict:
    x = rng.standard_normal((4, 5))
    if domain == "pos":
        x = np.abs(x) + 0.2
    elif domain == "nonzero":
        x = np.where(np.abs(x) < 0.05, 0.3, x)
    return {"X": torch.tensor(x), "Y": torch.tensor(rng.standard_normal((4, 5))),
            "Bv": torch.tensor(rng.standard_normal(5)), "Rw": torch.tensor(rng.standard_normal(out_shape))}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


@pytest.mark.parametrize("name,expr,fn,domain", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_autograd_and_central_differences(name, expr, fn, domain) -> None:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    # The output shape of the expression decides the projection's shape.
    probe = _inputs(np.random.default_rng(0), domain, (1, 1))
    nargs = fn.__code__.co_argcount
    out_shape = tuple(fn(*[probe[k] for k in ("X", "Y", "Bv")][:nargs]).shape) if nargs == 3 else \
        tuple(fn(probe["X"], probe["Y"]).shape)
    inputs = _inputs(rng, domain, out_shape)
    engine = engine_of(compile_source(_program(expr, out_shape), f"{name}.xg"))
    value, (gx, gy, gb) = engine.run(inputs).value

    x, y, b = (inputs[k].clone().requires_grad_() for k in ("X", "Y", "Bv"))
    out = fn(x, y, b) if nargs == 3 else fn(x, y)
    loss = (out * inputs["Rw"]).sum()
    loss.backward()
    ref_value = loss.item()
    assert abs(value - ref_value) <= 1e-10 * max(1.0, abs(ref_value)), f"seed {seed}"
    for got, ref, label in ((gx, x.grad, "x"), (gy, y.grad, "y"), (gb, b.grad, "b")):
        ref = torch.zeros_like(inputs["X"] if label != "b" else inputs["Bv"]) if ref is None else ref
        if float(ref.norm()) == 0:
            assert float(got.norm()) == 0, f"{label}: seed {seed}"
        else:
            assert _rel(got, ref) < 1e-6, f"{label}: rel err {_rel(got, ref):.2e}, seed {seed}"

    # Central differences through XG's own forward pass, on a few coordinates of x. (Not for the
    # float32 round trip: a step of 1e-6 is below float32's resolution there.)
    if name == "cast":
        return
    fwd = engine_of(compile_source(_program(expr, out_shape).replace("value_and_grad(f, wrt=(x, y, b))", "f"),
                                              f"{name}_fwd.xg"))
    eps = 1e-6
    for idx in [(0, 0), (1, 3), (3, 4)]:
        plus, minus = dict(inputs), dict(inputs)
        plus["X"] = inputs["X"].clone()
        plus["X"][idx] += eps
        minus["X"] = inputs["X"].clone()
        minus["X"][idx] -= eps
        numeric = (fwd.run(plus).value - fwd.run(minus).value) / (2 * eps)
        analytic = float(gx[idx])
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), f"{idx}: {numeric} vs {analytic}, seed {seed}"


def test_non_differentiable_uses_are_compile_errors() -> None:
    src = ("def f(int64 n, Tensor[float32, 4] x) -> float32 {\n    return sum(x)\n}\n"
           "def main() {\n    return grad(f, wrt=n)(3, ones([4], float32))\n}\n")
    with pytest.raises(CompileError) as err:
        compile_source(src)
    assert "XG0112" in str(err.value) and ":5:" in str(err.value).replace(" --> program.xg", "")
    src2 = ("def f(Tensor[float32, 4] x) -> Tensor[float32, 4] {\n    return x\n}\n"
            "def main() {\n    return grad(f, wrt=x)(ones([4], float32))\n}\n")
    with pytest.raises(CompileError, match="XG0112"):
        compile_source(src2)


def test_gradient_through_calls_and_control_flow() -> None:
    src = """
def inner(Tensor[float64, N] v) -> Tensor[float64, N] {
    return tanh(v) * 2.0
}
def f(Tensor[float64, N] x, float64 s) -> float64 {
    if s > 0.0 {
        return sum(inner(x) * s)
    }
    return sum(x * x)
}
def main() {
    return grad(f, wrt=(x, s))(X, S)
}
"""
    engine = engine_of(compile_source(src))
    xs = torch.randn(6, dtype=torch.float64)
    for s in (0.7, -0.4):
        gx, gs = engine.run({"X": xs, "S": torch.tensor(s, dtype=torch.float64)}).value
        xt = xs.clone().requires_grad_()
        st = torch.tensor(s, dtype=torch.float64, requires_grad=True)
        loss = (torch.tanh(xt) * 2.0 * st).sum() if s > 0 else (xt * xt).sum()
        loss.backward()
        assert _rel(gx, xt.grad) < 1e-12
        assert abs(gs - (float(st.grad) if st.grad is not None else 0.0)) < 1e-12


def test_gradient_through_a_comparison_is_a_compile_error() -> None:
    src = ("def f(Tensor[float32, 4] x) -> float32 {\n    c = cast(x > 0.0, float32)\n    return sum(c * 2.0)\n}\n"
           "def main() {\n    return grad(f, wrt=x)(ones([4], float32))\n}\n")
    with pytest.raises(CompileError) as err:
        compile_source(src, "cmp.xg")
    text = str(err.value)
    assert "XG0112" in text and "cast" in text and "cmp.xg:2:" in text


def test_where_on_a_comparison_is_differentiable() -> None:
    src = ("def f(Tensor[float64, 4] x) -> float64 {\n    return sum(where(x > 0.0, x * 3.0, x * x))\n}\n"
           "def main() {\n    return grad(f, wrt=x)(X)\n}\n")
    engine = engine_of(compile_source(src))
    x = torch.tensor([1.0, -2.0, 0.5, -0.25], dtype=torch.float64)
    torch.testing.assert_close(engine.run({"X": x}).value, torch.where(x > 0, 3.0, 2 * x))
