"""Small programs written here, compiled and run on the CPU, against numpy in float64.

Each exercises one part of the language end to end: `if`/`else` with returns, `Result` through
`match` and `unwrap_or` and as main's result, tuples, indexing and slicing, `where`, reductions,
`transpose`/`reshape`, integer `/` and `%` (truncating, like C), and counter-based `randn`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import FLOAT64_MODE_TOL, REPO_ROOT, TOLERANCE, Rand, assert_close, compile_text, src_text, write_program

import xg

F32 = TOLERANCE["float32"]


# ------------------------------------------------------------------------------- control flow

IF_ELSE = src_text("""
    extern Tensor[float32, N] X
    def pick(Tensor[float32, N] x, float32 t) -> Tensor[float32, N] {
        if t > 0.0 {
            return x * 2.0
        } else {
            return x - 1.0
        }
    }
    def classify(float32 s) -> int64 {
        if s > 1.0 {
            return 2
        } else if s > 0.0 {
            return 1
        }
        return 0
    }
    def main() {
        s = sum(X)
        y = X
        if s > 0.0 {
            y = exp(X)
        } else {
            y = X * X
        }
        return pick(X, s), classify(s), y, pick(X, -1.0)
    }
""")


@pytest.mark.parametrize("shift", [-3.0, 0.0, 3.0])
def test_if_else_with_returns(shift: float, rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, IF_ELSE)
    x, x64 = rand.tensor((rand.size(1, 12),), shift=shift)
    s = x64.sum()
    picked, cls, y, other = engine.run({"X": x}).value
    assert_close(picked, x64 * 2.0 if s > 0 else x64 - 1.0, F32, rand, "pick(X, s)")
    assert cls == (2 if s > 1 else 1 if s > 0 else 0), f"classify({s}) gave {cls} (seed {rand.seed})"
    assert_close(y, np.exp(x64) if s > 0 else x64 * x64, F32, rand, "if without returns")
    assert_close(other, x64 - 1.0, F32, rand, "pick(X, -1.0)")


RESULTS = src_text("""
    extern Tensor[float32] P
    extern Tensor[float32] Q
    def safe_div(float32 a, float32 b) -> Result[float32] {
        if b == 0 { return DivByZero }
        return Ok(a / b)
    }
    def main() {
        m = match safe_div(P, Q) {
            Ok(v) => v * 10.0,
            Err(e) => -1.0,
        }
        u = safe_div(P, Q).unwrap_or(7.0)
        return safe_div(P, Q), m, u
    }
""")


def test_result_ok(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, RESULTS)
    (p, p64), (q, q64) = rand.tensor(()), rand.tensor((), shift=4.0)
    r, m, u = engine.run({"P": p, "Q": q}).value
    assert isinstance(r, xg.ResultValue) and r.ok and r.error is None
    expect = float(np.float32(p64) / np.float32(q64))
    assert r.value == pytest.approx(expect, rel=1e-6), f"seed {rand.seed}"
    assert m == pytest.approx(expect * 10, rel=1e-6) and u == pytest.approx(expect, rel=1e-6)


def test_result_err_is_a_value_not_an_exception(rand: Rand, tmp_path) -> None:
    """Dividing by a zero that the guard catches: DivByZero comes back, check mode stays quiet."""
    engine = compile_text(tmp_path, RESULTS)
    p, _ = rand.tensor(())
    r, m, u = engine.run({"P": p, "Q": torch.tensor(0.0)}, check=True).value
    assert r == xg.ResultValue(False, None, "DivByZero")
    assert (m, u) == (-1.0, 7.0)


TUPLES = src_text("""
    extern Tensor[float32, T, D] X
    def stats(Tensor[float32, T, D] x) -> (Tensor[float32, T], float32) {
        return max(x, dim=1), mean(x)
    }
    def main() {
        (m, avg) = stats(X)
        return m, (avg, min(X)), stats(X * 2.0)
    }
""")


def test_tuple_returns(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, TUPLES)
    x, x64 = rand.tensor((rand.size(1, 9), rand.size(1, 9)))
    out = engine.run({"X": x}).value
    assert isinstance(out, tuple) and len(out) == 3
    m, (avg, mn), (m2, avg2) = out
    assert_close(m, x64.max(axis=1), F32, rand, "max dim=1")
    assert type(avg) is float and type(mn) is float
    assert avg == pytest.approx(x64.mean(), rel=1e-5, abs=1e-6) and mn == x64.min()
    assert_close(m2, 2 * x64.max(axis=1), F32, rand, "max of 2x")
    assert avg2 == pytest.approx(2 * x64.mean(), rel=1e-5, abs=1e-6)
    assert engine.manifest["entry"]["output"]["tuple"][1]["tuple"][0] == {"tensor": {"dtype": "float32", "shape": []}}


# ----------------------------------------------------------------------------- tensors, shapes

INDEXING = src_text("""
    extern Tensor[float32, 6, 8] X
    extern Tensor[int64] I
    def main() {
        return X[1], X[-1, 2:7:2], X[:, 3], X[2:5], X[1, 2], X[::2, 1::3], X[I], X[I, -3:]
    }
""")


def test_indexing_and_slicing(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, INDEXING)
    x, x64 = rand.tensor((6, 8))
    i = int(rand.gen.integers(-6, 6))
    got = engine.run({"X": x, "I": torch.tensor(i)}).value
    refs = [x64[1], x64[-1, 2:7:2], x64[:, 3], x64[2:5], x64[1, 2], x64[::2, 1::3], x64[i], x64[i, -3:]]
    assert len(got) == len(refs)
    for k, (y, ref) in enumerate(zip(got, refs)):
        assert np.array_equal(np.asarray(y if not isinstance(y, torch.Tensor) else y.numpy(), dtype=np.float64),
                              ref), f"item {k} differs (I={i}, seed {rand.seed})"


def test_run_time_index_out_of_bounds_is_an_execution_error(tmp_path) -> None:
    engine = compile_text(tmp_path, INDEXING)
    with pytest.raises(xg.ExecutionError, match=r"index 6 is out of bounds for dimension 0 of size 6 at line 4"):
        engine.run({"X": torch.randn(6, 8), "I": torch.tensor(6)})


NEGATIVE_STEP = src_text("""
    extern Tensor[float32, 6, 8] X
    def main() {
        return X[::-1], X[1, 6:1:-2]
    }
""")


def test_slicing_with_a_negative_step(rand: Rand, tmp_path) -> None:
    """The checker accepts negative steps (and types `X[::-1]` as [6, 8]); the executor must run them."""
    engine = compile_text(tmp_path, NEGATIVE_STEP)
    x, x64 = rand.tensor((6, 8))
    a, b = engine.run({"X": x}).value
    assert np.array_equal(a.numpy(), x64[::-1]) and np.array_equal(b.numpy(), x64[1, 6:1:-2])


SYMBOLIC_SLICE = src_text("""
    extern Tensor[float32, N, M] X
    def main() {
        return X[1:3], X[:, 0:2]
    }
""")


def test_slicing_a_symbolic_dim(rand: Rand, tmp_path) -> None:
    """Slices of dims known only at run time (the checker accepts them) compile and run."""
    engine = compile_text(tmp_path, SYMBOLIC_SLICE)
    x, x64 = rand.tensor((rand.size(3, 8), rand.size(2, 8)))
    a, b = engine.run({"X": x}).value
    assert np.array_equal(a.numpy(), x64[1:3]) and np.array_equal(b.numpy(), x64[:, 0:2])


SHAPES = src_text("""
    extern Tensor[float32, 2, 3, 4] Y
    extern Tensor[float32, N, M] X
    def main() {
        w = where(X > 0.0, X, 0.5 * X)
        return (transpose(Y, 0, 2), transpose(Y), reshape(Y, [4, 6]), reshape(transpose(Y), [8, 3]), w,
                X @ transpose(X), Y @ transpose(Y), softmax(Y, dim=0), log_softmax(X, dim=0))
    }
""")


def test_where_transpose_reshape(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, SHAPES)
    (y, y64), (x, x64) = rand.tensor((2, 3, 4)), rand.tensor((rand.size(2, 7), rand.size(2, 7)))
    got = engine.run({"Y": y, "X": x}).value
    yt = y64.transpose(0, 2, 1)
    lsm = x64 - x64.max(axis=0) - np.log(np.exp(x64 - x64.max(axis=0)).sum(axis=0))
    e0 = np.exp(y64 - y64.max(axis=0))
    refs = [y64.transpose(2, 1, 0), yt, y64.reshape(4, 6), yt.reshape(8, 3), np.where(x64 > 0, x64, 0.5 * x64),
            x64 @ x64.T, y64 @ yt, e0 / e0.sum(axis=0), lsm]
    for k, (v, ref) in enumerate(zip(got, refs)):
        assert_close(v, ref, F32, rand, f"item {k}")


REDUCTIONS = src_text("""
    extern Tensor[float32, N, M] X
    def main() {
        return (sum(X), mean(X), max(X), min(X), sum(X, keepdim=true), max(X, keepdim=true),
                sum(X, dim=0), mean(X, dim=-1, keepdim=true), min(X, dim=1), max(X, dim=0, keepdim=true))
    }
""")


def test_reductions(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, REDUCTIONS)
    x, x64 = rand.tensor((rand.size(1, 9), rand.size(1, 9)), scale=0.25, shift=1.0)   # sums that do not cancel
    got = engine.run({"X": x}).value
    refs = [x64.sum(), x64.mean(), x64.max(), x64.min(), x64.sum(keepdims=True), x64.max(keepdims=True),
            x64.sum(axis=0), x64.mean(axis=-1, keepdims=True), x64.min(axis=1), x64.max(axis=0, keepdims=True)]
    for k, (v, ref) in enumerate(zip(got, refs)):
        if ref.ndim == 0:
            assert type(v) is float, f"item {k}: a rank-0 output must be a Python float, got {type(v)}"
        assert_close(v, ref, F32, rand, f"item {k}")
    assert got[4].shape == (1, 1)


def test_float64_mode_on_an_inline_program(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, REDUCTIONS)
    x, x64 = rand.tensor((rand.size(1, 9), rand.size(1, 9)), scale=0.25, shift=1.0)
    got = engine.run({"X": x}, float64=True).value
    assert_close(got[7], x64.mean(axis=-1, keepdims=True), FLOAT64_MODE_TOL, rand, "mean in float64 mode")
    assert got[1] == pytest.approx(x64.mean(), rel=1e-13)


# ------------------------------------------------------------------------------ integers

INTEGERS = src_text("""
    extern Tensor[int64, N] A
    extern Tensor[int64, N] B
    extern Tensor[int32, N] C
    def main() {
        d = B * B + 1
        return A / 7, A % 7, A / (-3), A % (-3), A / d, A % d, C / 5, C % (-5), (A + 3) * 2 - B
    }
""")


def trunc_div(a: np.ndarray, b) -> tuple[np.ndarray, np.ndarray]:
    """C-style division: the quotient truncated toward zero, the remainder with the dividend's sign."""
    q = np.trunc(a.astype(np.float64) / b).astype(np.int64)
    return q, a - np.asarray(b) * q


def test_integer_division_and_modulo_truncate(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, INTEGERS)
    n = rand.size(8, 40)
    a, b, c = rand.ints((n,), -1000, 1000), rand.ints((n,), -5, 6), rand.ints((n,), -1000, 1000, "int32")
    a[:4] = torch.tensor([-7, 7, -21, 0])        # exact multiples and the negative cases C and Python disagree on
    got = engine.run({"A": a, "B": b, "C": c}).value
    a64, b64, c64 = a.numpy(), b.numpy(), c.numpy()
    d = b64 * b64 + 1
    refs = [*trunc_div(a64, 7), *trunc_div(a64, -3), *trunc_div(a64, d), trunc_div(c64, 5)[0],
            trunc_div(c64, -5)[1], (a64 + 3) * 2 - b64]
    dtypes = [torch.int64] * 6 + [torch.int32] * 2 + [torch.int64]
    for k, (v, ref, dt) in enumerate(zip(got, refs, dtypes)):
        assert v.dtype == dt, f"item {k}: dtype {v.dtype}, expected {dt}"
        assert np.array_equal(v.numpy(), ref), f"item {k}: {v.numpy()} != {ref} (seed {rand.seed})"


GUARDED_INT = src_text("""
    extern Tensor[int64] P
    extern Tensor[int64] Q
    def idiv(int64 a, int64 b) -> Result[int64] {
        if b == 0 { return DivByZero }
        return Ok(a / b)
    }
    def imod(int64 a, int64 b) -> Result[int64] {
        if b == 0 {
            return DivByZero
        }
        return Ok(a % b)
    }
    def main() {
        return idiv(P, Q), imod(P, Q).unwrap_or(-1)
    }
""")


@pytest.mark.parametrize("p, q", [(7, 2), (-7, 2), (7, -2), (-7, -2), (-7, 0), (0, 5)])
def test_guarded_integer_division(p: int, q: int, tmp_path) -> None:
    engine = compile_text(tmp_path, GUARDED_INT)
    r, m = engine.run({"P": torch.tensor(p), "Q": torch.tensor(q)}).value
    if q == 0:
        assert r == xg.ResultValue(False, None, "DivByZero") and m == -1
    else:
        quot, rem = trunc_div(np.array(p), q)
        assert r == xg.ResultValue(True, int(quot), None) and m == int(rem)


# ------------------------------------------------------------------------------ randn

RANDN = src_text("""
    def main() {
        a = randn([1000], float32, seed=42)
        return a, randn([4, 5], float32, seed=43), randn([1000], float32, seed=42), randn([3, 7], bfloat16, seed=42)
    }
""")

_DIGEST_SNIPPET = """
import hashlib, sys
import xg
out = xg.run_engine(xg.compile_file(sys.argv[1])).value
print(";".join(hashlib.sha256(t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()).hexdigest()
               for t in out))
"""


def _digests(values) -> str:
    return ";".join(hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                    for t in values)


def test_randn_is_deterministic_across_runs_and_processes(tmp_path) -> None:
    path = write_program(tmp_path, RANDN)
    first = xg.run_engine(xg.compile_file(path)).value
    second = xg.run_engine(xg.compile_file(path)).value
    assert _digests(first) == _digests(second)
    a, b, a_again, h = first
    assert torch.equal(a, a_again), "the same seed and shape must give the same bits"
    assert not torch.equal(a[:20], b.reshape(-1)), "different seeds must give different samples"
    assert h.dtype == torch.bfloat16 and torch.equal(h, a[:21].reshape(3, 7).to(torch.bfloat16)), \
        "randn is a function of (seed, element index) only, whatever the shape and dtype"
    proc = subprocess.run([sys.executable, "-c", _DIGEST_SNIPPET, str(path)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == _digests(first), "another process drew other bits"


def test_randn_in_float64_mode_widens_the_same_samples(tmp_path) -> None:
    engine = compile_text(tmp_path, RANDN)
    a32 = engine.run().value[0]
    a64 = engine.run(float64=True).value[0]
    assert a64.dtype == torch.float64 and torch.equal(a64, a32.to(torch.float64))
