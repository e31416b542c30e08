"""The generated Triton kernels' numbers on a CPU host: each program's kernels (the tuned variant at
the tuning shape, the generic one at odd sizes) run under Triton's interpreter and are compared with
the float64 CPU reference. Triton 3.6's interpreter multiplies bf16 `tl.dot` operands' bits as
integers; `interpret.enable` widens them to float32 first, so bf16 products are checked here too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xgbuild.compiler.ops import UNARY_BUILTINS

REPO = Path(__file__).resolve().parents[3]

PROGRAMS = {
    "norms": ("examples/norms.xg", None),
    "contract": ("examples/contract.xg", None),
    "safe_div": ("examples/safe_div.xg", None),     # constants as outputs (also when replayed)
    "mlp_fp32": ("examples/mlp.xg", ("bfloat16", "float32")),
    "attention_fp32": ("examples/attention.xg", ("bfloat16", "float32")),
    "mlp_bf16": ("examples/mlp.xg", None),
    "attention_bf16": ("examples/attention.xg", None),
    "reductions": (None, """extern Tensor[float32, T, D] X
extern Tensor[float32, D] B
def main() {
    return sum(X, dim=0), mean(exp(X)), max(X + B, dim=1), softmax(X, dim=0), log_softmax(X * 2.0, dim=1)
}
"""),
    "elementwise": (None, """extern Tensor[float32, T, D] X
extern Tensor[int32, T, D] I
extern Tensor[bfloat16, D] G
def main() {
    y = where(X > 0.0, tanh(X) * cast(G, float32), silu(X) - relu(X))
    return y, I / 3, I % 3, abs(X) >= 0.5, transpose(X) + 1.0, sigmoid(X) * erf(X), maximum(X, -X)
}
"""),
    # Every element-wise builtin the op registry declares, on a positive argument (their common domain).
    "unary_builtins": (None, "extern Tensor[float32, T, D] X\ndef main() {\n    return "
                       + ", ".join(f"{name}(X * X + 0.25)" for name in sorted(UNARY_BUILTINS)) + "\n}\n"),
    # The gradient of indexed reads (`unindex`): constant, negative-step, strided and run-time
    # indices, bf16, fused with a consumer.
    # (Fixed sizes: the IR does not add gradients of differently sliced symbolic dims.)
    "unindex": (None, """extern Tensor[float32, 6, 8] X
extern Tensor[bfloat16, 5, 7, 3] Y
extern int64 I
def f(Tensor[float32, 6, 8] x, int64 i) -> float32 {
    return sum(x[1] * x[1]) + sum(x[::-1, 2] * 3.0) + sum(x[1:5:2, ::3]) + sum(x[i % 3, 2:7])
}
def g(Tensor[bfloat16, 5, 7, 3] y) -> float32 {
    return sum(cast(y[-2, 1::2], float32) * 2.0)
}
def main() {
    return grad(f, wrt=x)(X, I) + X, grad(g, wrt=y)(Y)
}
"""),
    # Vector operands (a row of A, a column of B) and integer products (wrapping like torch's).
    "vector_int_matmul": (None, """extern Tensor[float32, D] A
extern Tensor[float32, D, F] B
extern Tensor[float32, F] C
extern Tensor[float32, B, F, D] E
extern Tensor[int32, T, D] I
extern Tensor[int32, D, F] J
def main() {
    return A @ B, relu(B @ C + 1.0), (A @ B) @ C, E @ A + 2.0, I @ J + 3
}
"""),
    # Operands that are views at an offset of a kernel's output and copies (a reshape of a transposed
    # value, as attention heads merge): replayed by computing them again from their sources.
    "views": (None, """extern Tensor[float32, 6, 8] X
extern Tensor[float32, 8, 4] W
def main() {
    h = X @ W
    return reshape(transpose(h), [2, 12]) * 2.0, h[1:5, :] @ transpose(W), reshape(transpose(X), [4, 12]) + 1.0
}
"""),
    # A training-style gradient whose backward pass recomputes the forward's element-wise values
    # (passes/remat.py): LayerNorm, tanh GELU, a softmax, a `where`.
    "remat": (None, """extern Tensor[float32, T, D] X
extern Tensor[float32, D, F] W
extern Tensor[float32, F] C
def f(Tensor[float32, T, D] x, Tensor[float32, D, F] w, Tensor[float32, F] b) -> float32 {
    c = x - mean(x, dim=1, keepdim=true)
    h = c * rsqrt(mean(c * c, dim=1, keepdim=true) + 1e-5)
    a = h @ w + b
    g = 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
    p = softmax(g, dim=1)
    return sum(where(g > 0.0, p, 0.5 * p) @ transpose(w) * x)
}
def main() {
    return grad(f, wrt=(w, b))(X, W, C)
}
"""),
    # Attention's gradients flash-style (passes/flash.py, templates/flash.py): causal with a finite
    # fill, and unmasked (T != S at the odd sizes); bfloat16 products in tests/unit/codegen/test_flash.py.
    "attention_grad": (None, """extern Tensor[float32, B, T, D] Q
extern Tensor[float32, B, S, D] K
extern Tensor[float32, B, S, F] V
extern Tensor[float32, B, T, F] G
def causal(Tensor[float32, B, T, D] q, Tensor[float32, B, S, D] k, Tensor[float32, B, S, F] v,
           Tensor[float32, B, T, F] g) -> float32 {
    keep = reshape(arange(T), [T, 1]) >= reshape(arange(S), [1, S])
    return sum(softmax(where(keep, (q @ transpose(k)) * 0.125, -1e9), dim=2) @ v * g)
}
def plain(Tensor[float32, B, T, D] q, Tensor[float32, B, S, D] k, Tensor[float32, B, S, F] v,
          Tensor[float32, B, T, F] g) -> float32 {
    return sum(softmax(0.3 * (q @ transpose(k)), dim=2) @ v * g)
}
def main() {
    return grad(causal, wrt=(q, k, v))(Q, K, V, G), grad(plain, wrt=(q, k, v))(Q, K, V, G)
}
"""),
    # A tanh GELU's terms recomputed for its gradient inside the gradient product's epilogue
    # (passes/remat.py's per-reader clones, schedule.py's epilogue; test_remat.py checks the
    # same with bfloat16 products).
    "gelu_grad": (None, """extern Tensor[float32, T, D] X
extern Tensor[float32, D, F] W1
extern Tensor[float32, F, D] W2
def f(Tensor[float32, T, D] x, Tensor[float32, D, F] w1, Tensor[float32, F, D] w2) -> float32 {
    a = x @ w1
    g = 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
    return sum((g @ w2) * (g @ w2))
}
def main() {
    return grad(f, wrt=(w1, w2))(X, W1, W2)
}
"""),
    # Whole-tensor reductions in two stages (passes/split_reductions.py): rows, then the row results.
    # (The bfloat16 sum, one stage, is of squares: a sum of signed values cancels down to where the
    # inputs' rounding to bfloat16, which the float64 reference leaves out, is most of it.)
    "split_reductions": (None, """extern Tensor[float32, 16, 64, 72] X
extern Tensor[int32, 48, 2048] I
def main() {
    return sum(X * X), mean(exp(X), keepdim=true), max(X), min(I), sum(cast(X * X, bfloat16))
}
"""),
    # A one-hot product as a table lookup (passes/lookups.py): indices in [-8, 8), so some rows
    # are out of the table's range (zeros); the table's gradient still the one-hot's product.
    "embedding": (None, """import std.nn
extern Tensor[int64, T] I
extern Tensor[float32, 13, D] E
extern Tensor[float32, T, D] G
def f(Tensor[int64, T] i, Tensor[float32, 13, D] e, Tensor[float32, T, D] g) -> float32 {
    return sum(embed(i, e) * g)
}
def main() {
    return embed(I, E) * 2.0, grad(f, wrt=(e))(I, E, G)
}
"""),
    # Reductions along strided dims, rows adjacent in memory (templates/rowwise.py's column form;
    # the long ones in two stages, passes/split_reductions.py), element-wise work on both sides.
    "column_reductions": (None, """extern Tensor[float32, 2048, D] Y
extern Tensor[bfloat16, T, D] H
extern Tensor[float32, B, T, D] Z
def main() {
    return (sum(Y * 2.0, dim=0), max(exp(Y), dim=0, keepdim=true), mean(cast(H, float32), dim=0) * 3.0,
            sum(Z, dim=0), min(Z, dim=1))
}
"""),
    # Attention's head split differentiated: each head gradient placed in its third of the fused
    # qkv gradient as a [B, T, 3, H, DH] unindex read through the transpose's strides.
    "head_grads": (None, """extern Tensor[float32, 16, 36] QKV
extern Tensor[float32, 2, 3, 8, 4] G
def heads(Tensor[float32, 16, 12] x) -> Tensor[float32, 2, 3, 8, 4] {
    return transpose(reshape(x, [2, 8, 3, 4]), dim0=1, dim1=2)
}
def f(Tensor[float32, 16, 36] qkv, Tensor[float32, 2, 3, 8, 4] g) -> float32 {
    return sum(heads(qkv[:, 0:12]) * g) + sum(exp(heads(qkv[:, 12:24]) * 0.1) * g) + sum(heads(qkv[:, 24:36]) * g * g)
}
def main() {
    return grad(f, wrt=(qkv))(QKV, G)
}
"""),
    # Broadcasts' gradients: a `full(0)` of [T, D] per reader (fork-casts), each recomputed in the
    # kernel of what it is added to (tests/unit/passes/test_fork_casts.py).
    "broadcast_grads": (None, """import std.nn
extern Tensor[float32, T, D] X
extern Tensor[float32, D] C
extern Tensor[float32, D, D] V
def f(Tensor[float32, T, D] x, Tensor[float32, D] g, Tensor[float32, D, D] w) -> float32 {
    h = layer_norm(x, g, g * 0.5) @ w + x
    y = layer_norm(h, g, g) @ w + h
    return sum(y * y)
}
def main() {
    return grad(f, wrt=(x, g, w))(X, C, V)
}
"""),
    "batched": (None, """extern Tensor[float32, B, T, D] X
extern Tensor[float32, D, F] W
extern Tensor[float32, F] C
def main() {
    return gelu(X @ W + C) @ transpose(W)
}
"""),
}


def _run(tmp_path: Path, name: str, dims: dict[str, int]) -> list[dict]:
    path, extra = PROGRAMS[name]
    if path is None:
        src = tmp_path / f"{name}.xg"
        src.write_text(extra)
    else:
        src = REPO / path
        if extra:
            text = src.read_text().replace(*extra)
            src = tmp_path / f"{name}.xg"
            src.write_text(text)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "xgbuild.build.interpreted", str(src),
                           *(f"{k}={v}" for k, v in dims.items())], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float64": 1e-12}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dims", [{"T": 32, "D": 64, "F": 48, "S": 32, "B": 2},
                                  {"T": 19, "D": 37, "F": 23, "S": 13, "B": 3}], ids=["aligned", "odd"])
def test_kernels_match_float64_reference(tmp_path: Path, name: str, dims: dict) -> None:
    report = _run(tmp_path, name, dims)
    assert report
    # The second input set replays the first run's launches unless a run-time index forbids it.
    assert any(out["replayed"] for out in report) == (name != "unindex")
    for out in report:
        if out["dtype"] in TOL:
            assert out["rel_err"] < TOL[out["dtype"]], out
        else:
            assert out["rel_err"] == 0.0, out
