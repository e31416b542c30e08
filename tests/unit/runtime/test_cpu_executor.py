"""Tests for `xgbuild.runtime.cpu`: every op against numpy in float64, on fresh random data.

Graphs are built node by node (dtype and shape from the IR's own rules, `ir.shapes.infer`) and run
by `CpuExecutor`; each float op is compared by relative norm error with a float64 numpy reference.
The data is not seeded: the generator's entropy is in every failure message. `counter_randn` is
checked for its statistics (mean 0, std 1 over 1e5 samples) and for bit-determinism (across
processes in `tests/e2e/test_programs_numeric.py`).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from xgbuild.compiler.ir.graph import GraphBuilder, Node, Op, attrs_of
from xgbuild.compiler.ir.shapes import infer
from xgbuild.errors import ExecutionError
from xgbuild.runtime.cpu import TORCH_DTYPES, CpuExecutor, counter_randn

XG_NAME = {v: k for k, v in TORCH_DTYPES.items()}
TOL = {"float32": 1e-6, "float64": 1e-13, "bfloat16": 1e-2, "float16": 2e-3}
_erf = np.vectorize(math.erf, otypes=[np.float64])


# ------------------------------------------------------------------------------------ helpers

class Rng:
    """A fresh numpy Generator that remembers its entropy (`seed_entropy`) for failure messages."""

    def __init__(self) -> None:
        ss = np.random.SeedSequence()
        self.seed_entropy = ss.entropy
        self.gen = np.random.default_rng(ss)

    def __getattr__(self, name: str):
        return getattr(self.gen, name)


@pytest.fixture
def rng() -> Rng:
    return Rng()


def data(rng, shape, dtype="float32", low=None, high=None) -> torch.Tensor:
    """Normal (or uniform in [low, high)) data rounded to `dtype`; never all zeros."""
    x = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
    return torch.from_numpy(np.asarray(x)).to(TORCH_DTYPES[dtype])


def f64(t) -> np.ndarray:
    return t.detach().to(torch.float64).numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float64)


def assert_close(y: torch.Tensor, ref: np.ndarray, tol: float, rng, what: str) -> None:
    y64, ref = f64(y), np.asarray(ref, np.float64)
    assert y64.shape == ref.shape, f"{what}: shape {y64.shape} != {ref.shape}"
    err = np.linalg.norm(y64 - ref) / max(np.linalg.norm(ref), 1e-300)
    assert err <= tol, f"{what}: relative norm error {err:.2e} > {tol:.0e} (data seed {rng.seed_entropy})"


class G:
    """A graph under construction: inputs are fed by value, shapes come from the IR's rules."""

    def __init__(self) -> None:
        self.b = GraphBuilder("main")
        self.feeds: dict[str, torch.Tensor] = {}

    def input(self, t: torch.Tensor) -> int:
        name = f"x{len(self.feeds)}"
        nid = self.b.add(Op.INPUT, (), XG_NAME[t.dtype], tuple(t.shape), attrs_of(name=name))
        self.b.inputs.append((name, nid))
        self.feeds[name] = t
        return nid

    def const(self, value, dtype: str) -> int:
        return self.b.add(Op.CONST, (), dtype, (), attrs_of(value=value))

    def source(self, op: Op, dtype: str, shape: tuple, *inputs: int, **attrs) -> int:
        return self.b.add(op, inputs, dtype, shape, attrs_of(**attrs))

    def op(self, op: Op, *inputs: int, dtype: str = "", line: int | None = None, **attrs) -> int:
        attrs_t = attrs_of(**attrs)
        probe = Node(-1, op, tuple(inputs), dtype, (), attrs_t)
        dt, shape = infer(probe, [(self.b.node(i).dtype, self.b.node(i).shape) for i in inputs])
        return self.b.add(op, inputs, dt, shape, attrs_t, (line, 5) if line else None)

    def graph(self, out):
        tree = {"tuple": [{"t": i} for i in out]} if isinstance(out, (list, tuple)) else {"t": out}
        return self.b.build(tree)

    def run(self, out, *, float64: bool = False, check: bool = False):
        result = CpuExecutor(float64=float64, check=check).run(self.graph(out), self.feeds)
        if isinstance(out, (list, tuple)):
            return [result.values[i] for i in out]
        return result.values[out]


def unary(op: Op, x: torch.Tensor, **kw) -> torch.Tensor:
    g = G()
    return g.run(g.op(op, g.input(x)), **kw)


def binary(op: Op, a: torch.Tensor, b: torch.Tensor, **kw) -> torch.Tensor:
    g = G()
    return g.run(g.op(op, g.input(a), g.input(b)), **kw)


# ------------------------------------------------------------------------------------ unary

UNARY_REF = {
    Op.NEG: (lambda x: -x, None),
    Op.EXP: (np.exp, None),
    Op.LOG: (np.log, (0.05, 5.0)),
    Op.SQRT: (np.sqrt, (0.0, 5.0)),
    Op.RSQRT: (lambda x: 1 / np.sqrt(x), (0.05, 5.0)),
    Op.SIGMOID: (lambda x: 1 / (1 + np.exp(-x)), None),
    Op.TANH: (np.tanh, None),
    Op.GELU: (lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), None),
    Op.SILU: (lambda x: x / (1 + np.exp(-x)), None),
    Op.RELU: (lambda x: np.maximum(x, 0), None),
    Op.ABS: (np.abs, None),
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("op", list(UNARY_REF), ids=lambda op: op.value)
def test_unary(op: Op, dtype: str, rng) -> None:
    fn, domain = UNARY_REF[op]
    x = data(rng, (int(rng.integers(1, 9)), int(rng.integers(1, 33))), dtype, *(domain or (None, None)))
    y = unary(op, x)
    assert y.dtype == x.dtype
    assert_close(y, fn(f64(x)), TOL[dtype], rng, f"{op.value} {dtype}")


@pytest.mark.parametrize("op", list(UNARY_REF), ids=lambda op: op.value)
def test_unary_float64_mode(op: Op, rng) -> None:
    fn, domain = UNARY_REF[op]
    x = data(rng, (7, 13), "float32", *(domain or (None, None)))
    y = unary(op, x, float64=True)
    assert y.dtype == torch.float64
    assert_close(y, fn(f64(x)), 1e-13, rng, f"{op.value} in float64 mode")


def test_not(rng) -> None:
    x = torch.from_numpy(rng.integers(0, 2, (5, 6)).astype(bool))
    assert torch.equal(unary(Op.NOT, x), ~x)


# ------------------------------------------------------------------------------------ binary

FLOAT_BINARY = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide,
                Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum, Op.MOD: np.fmod}
COMPARE = {Op.EQ: np.equal, Op.NE: np.not_equal, Op.LT: np.less, Op.LE: np.less_equal, Op.GT: np.greater,
           Op.GE: np.greater_equal}
SHAPE_PAIRS = [((4, 5), (4, 5)), ((4, 5), (5,)), ((4, 1), (1, 5)), ((3, 4, 5), (5,)), ((), (4, 5)), ((4, 5), ())]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
@pytest.mark.parametrize("op", list(FLOAT_BINARY), ids=lambda op: op.value)
def test_float_binary(op: Op, shapes, dtype: str, rng) -> None:
    a = data(rng, shapes[0], dtype)
    b = data(rng, shapes[1], dtype)
    if op in (Op.DIV, Op.MOD):      # keep divisors away from zero
        b = (b.abs() + 0.5) * torch.where(b < 0, -1.0, 1.0).to(b.dtype)
    y = binary(op, a, b)
    assert y.dtype == a.dtype
    ref = FLOAT_BINARY[op](f64(a), f64(b))
    # One rounding of the exact result: fmod is exact, the others are within half an ulp.
    assert_close(y, ref, TOL[dtype], rng, f"{op.value} {dtype} {shapes}")


@pytest.mark.parametrize("op", list(COMPARE), ids=lambda op: op.value)
def test_comparisons(op: Op, rng) -> None:
    a = data(rng, (6, 7))
    b = torch.where(torch.from_numpy(rng.integers(0, 2, (6, 7)).astype(bool)), a, data(rng, (6, 7)))
    y = binary(op, a, b)
    assert y.dtype == torch.bool
    assert np.array_equal(y.numpy(), COMPARE[op](a.numpy(), b.numpy()))


@pytest.mark.parametrize("op, fn", [(Op.AND, np.logical_and), (Op.OR, np.logical_or)], ids=["and", "or"])
def test_logical(op: Op, fn, rng) -> None:
    a, b = (torch.from_numpy(rng.integers(0, 2, (4, 9)).astype(bool)) for _ in range(2))
    assert np.array_equal(binary(op, a, b).numpy(), fn(a.numpy(), b.numpy()))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_integer_division_truncates_toward_zero(dtype: str, rng) -> None:
    a = torch.from_numpy(rng.integers(-100, 100, 200)).to(TORCH_DTYPES[dtype])
    b = torch.from_numpy(rng.integers(1, 12, 200) * rng.choice([-1, 1], 200)).to(TORCH_DTYPES[dtype])
    q, r = (binary(op, a, b) for op in (Op.DIV, Op.MOD))
    a64, b64 = a.numpy().astype(np.int64), b.numpy().astype(np.int64)
    q_ref = np.trunc(a64 / b64).astype(np.int64)
    assert q.dtype == a.dtype and r.dtype == a.dtype
    assert np.array_equal(q.numpy(), q_ref), f"seed {rng.seed_entropy}"
    assert np.array_equal(r.numpy(), a64 - b64 * q_ref), f"seed {rng.seed_entropy}"


def test_integer_division_by_zero_on_a_discarded_path_does_not_raise() -> None:
    a, b = torch.tensor([7, -7, 3]), torch.tensor([0, 2, 0])
    q, r = binary(Op.DIV, a, b), binary(Op.MOD, a, b)
    assert q.tolist()[1] == -3 and r.tolist()[1] == -1          # the lanes that divide by 2
    assert q.dtype == torch.int64 and r.dtype == torch.int64


def test_integer_arithmetic_wraps_in_its_dtype() -> None:
    a = torch.tensor([100, -100], dtype=torch.int8)
    y = binary(Op.ADD, a, a)
    assert y.dtype == torch.int8 and y.tolist() == [-56, 56]


@pytest.mark.parametrize("shapes", [((4, 5), (4, 5), (4, 5)), ((4, 5), (5,), ()), ((), (3, 2), (2,))], ids=str)
def test_where(shapes, rng) -> None:
    c = torch.from_numpy(np.asarray(rng.integers(0, 2, shapes[0]).astype(bool)))
    a, b = data(rng, shapes[1]), data(rng, shapes[2])
    g = G()
    y = g.run(g.op(Op.WHERE, g.input(c), g.input(a), g.input(b)))
    assert np.array_equal(f64(y), np.where(c.numpy(), f64(a), f64(b)))


# ------------------------------------------------------------------------------------ contractions

MATMUL_SHAPES = [((5, 7), (7, 3)), ((1, 1), (1, 1)), ((2, 5, 7), (2, 7, 3)), ((2, 5, 7), (7, 3)), ((7,), (7, 3)),
                 ((5, 7), (7,)), ((64, 96), (96, 48))]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes, dtype: str, rng) -> None:
    a, b = data(rng, shapes[0], dtype), data(rng, shapes[1], dtype)
    y = binary(Op.MATMUL, a, b)
    assert y.dtype == a.dtype
    tol = {"float32": 1e-5, "float64": 1e-13, "bfloat16": 2e-2}[dtype]
    assert_close(y, f64(a) @ f64(b), tol, rng, f"matmul {dtype} {shapes}")


def test_matmul_float64_mode(rng) -> None:
    a, b = data(rng, (9, 31)), data(rng, (31, 5))
    assert_close(binary(Op.MATMUL, a, b, float64=True), f64(a) @ f64(b), 1e-13, rng, "matmul float64 mode")


def test_integer_matmul_is_exact(rng) -> None:
    a = torch.from_numpy(rng.integers(-50, 50, (4, 6)))
    b = torch.from_numpy(rng.integers(-50, 50, (6, 3)))
    assert np.array_equal(binary(Op.MATMUL, a, b).numpy(), a.numpy() @ b.numpy())


REDUCE_REF = {Op.SUM: np.sum, Op.MEAN: np.mean, Op.MAX: np.max, Op.MIN: np.min}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, 2])
@pytest.mark.parametrize("op", list(REDUCE_REF), ids=lambda op: op.value)
def test_reductions(op: Op, dim, keepdim: bool, rng) -> None:
    # Positive data: a sum that cancels would measure the reference's conditioning, not the op.
    x = data(rng, (3, 4, 5), low=0.5, high=1.5) if op in (Op.SUM, Op.MEAN) else data(rng, (3, 4, 5))
    g = G()
    y = g.run(g.op(op, g.input(x), dim=dim, keepdim=keepdim))
    ref = REDUCE_REF[op](f64(x), axis=dim, keepdims=keepdim)
    assert tuple(y.shape) == np.shape(ref)
    assert_close(y, ref, 1e-6, rng, f"{op.value} dim={dim} keepdim={keepdim}")


@pytest.mark.parametrize("op", list(REDUCE_REF), ids=lambda op: op.value)
def test_reduction_of_a_scalar(op: Op) -> None:
    g = G()
    y = g.run(g.op(op, g.input(torch.tensor(2.5)), dim=0))
    assert y.dim() == 0 and float(y) == 2.5


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("op", [Op.SUM, Op.MAX, Op.MIN], ids=lambda op: op.value)
def test_reductions_keep_the_dtype(op: Op, dtype: str, rng) -> None:
    """The IR types `sum(x)` as x's dtype; the executor must produce that dtype, not a wider one."""
    if dtype.startswith("int"):
        x = torch.from_numpy(rng.integers(-5, 5, (4, 6))).to(TORCH_DTYPES[dtype])
    else:
        x = data(rng, (4, 6), dtype)
    g = G()
    out = [g.op(op, g.input(x), dim=1), g.op(op, g.b.nodes[0].id, dim=None)]
    for node_id, y in zip(out, g.run(out)):
        declared = g.b.node(node_id).dtype
        assert XG_NAME[y.dtype] == declared, f"{op.value} of {dtype}: produced {y.dtype}, the IR says {declared}"


@pytest.mark.parametrize("op", [Op.SOFTMAX, Op.LOG_SOFTMAX], ids=lambda op: op.value)
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax(op: Op, dim: int, rng) -> None:
    x = data(rng, (3, 4, 5)) * 4
    x64 = f64(x)
    shifted = x64 - x64.max(axis=dim, keepdims=True)
    log_sm = shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))
    ref = np.exp(log_sm) if op is Op.SOFTMAX else log_sm
    g = G()
    assert_close(g.run(g.op(op, g.input(x), dim=dim)), ref, 1e-6, rng, f"{op.value} dim={dim}")


# ------------------------------------------------------------------------------------ shape ops

@pytest.mark.parametrize("dims", [(0, 1), (1, 2), (0, 2), (2, 2)])
def test_transpose(dims, rng) -> None:
    x = data(rng, (2, 3, 4))
    g = G()
    y = g.run(g.op(Op.TRANSPOSE, g.input(x), dim0=dims[0], dim1=dims[1]))
    assert np.array_equal(y.numpy(), np.swapaxes(x.numpy(), *dims))


def test_reshape(rng) -> None:
    x = data(rng, (2, 3, 4))
    g = G()
    src = g.input(x)
    y = g.run(g.source(Op.RESHAPE, "float32", (4, 6), src))
    assert np.array_equal(y.numpy(), x.numpy().reshape(4, 6))


def test_index(rng) -> None:
    x = data(rng, (5, 6, 7))
    g = G()
    xi = g.input(x)
    i = g.input(torch.tensor(-2))
    cases = [((("i", 1),), x.numpy()[1]),
             ((("s", 1, 4, None), ("i", -1)), x.numpy()[1:4, -1]),
             ((("s", None, None, 2), ("s", 5, 1, None), ("s", 0, 7, 3)), x.numpy()[::2, 5:1, 0:7:3]),
             ((("d", 1), ("i", 2), ("s", -3, None, None)), x.numpy()[-2, 2, -3:])]
    outs = []
    for items, _ in cases:
        inputs = (xi, i) if any(item[0] == "d" for item in items) else (xi,)
        outs.append(g.op(Op.INDEX, *inputs, items=items))
    for y, (items, ref) in zip(g.run(outs), cases):
        assert np.array_equal(y.numpy(), ref), items


def test_run_time_index_out_of_bounds(rng) -> None:
    g = G()
    y = g.op(Op.INDEX, g.input(data(rng, (4, 3))), g.input(torch.tensor(4)), items=(("d", 1),), line=9)
    with pytest.raises(ExecutionError, match="index 4 is out of bounds for dimension 0 of size 4 at line 9"):
        g.run(y)


@pytest.mark.parametrize("idx_shape", [(7,), (3, 5), (2, 3, 4)], ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("dtype, idx_dtype", [("float32", "int64"), ("bfloat16", "int32"), ("float64", "int64")])
def test_gather_matches_torch_embedding(idx_shape, dtype: str, idx_dtype: str, rng) -> None:
    table = data(rng, (11, 6), dtype)
    idx = torch.from_numpy(rng.integers(0, 11, idx_shape)).to(TORCH_DTYPES[idx_dtype])
    idx.view(-1)[:2] = torch.tensor([0, 10])         # the first and last rows
    g = G()
    out = g.op(Op.GATHER, g.input(table), g.input(idx))
    ref = torch.nn.functional.embedding(idx.long(), table.double()).numpy()
    for float64 in (False, True):
        y = g.run(out, float64=float64)
        assert y.dtype == (torch.float64 if float64 else table.dtype)
        # A gather copies values: exact in the table's own dtype and in float64 mode alike.
        assert np.array_equal(f64(y), ref), f"float64={float64} (data seed {rng.seed_entropy})"


def test_gather_of_a_1d_table_and_of_a_scalar_index(rng) -> None:
    table = data(rng, (9, 2, 3))
    g = G()
    t = g.input(table)
    vec = g.op(Op.GATHER, g.input(table[:, 0, 0].contiguous()), g.input(torch.tensor([[8, 0], [3, 3]])))
    one = g.op(Op.GATHER, t, g.input(torch.tensor(4)))
    y_vec, y_one = g.run([vec, one])
    assert np.array_equal(y_vec.numpy(), table[:, 0, 0].numpy()[[[8, 0], [3, 3]]])
    assert np.array_equal(y_one.numpy(), table.numpy()[4])


@pytest.mark.parametrize("bad", [11, -1])
def test_gather_index_out_of_bounds(bad: int, rng) -> None:
    g = G()
    y = g.op(Op.GATHER, g.input(data(rng, (11, 4))), g.input(torch.tensor([[0, bad], [2, 3]])), line=7)
    with pytest.raises(ExecutionError, match=f"index {bad} is out of bounds for a table of 11 rows at line 7"):
        g.run(y)


def test_gather_shape_rules() -> None:
    ins = [("float32", (10, "D")), ("int64", ("B", "T"))]
    assert infer(Node(-1, Op.GATHER, (0, 1), "float32", ()), ins) == ("float32", ("B", "T", "D"))
    with pytest.raises(ValueError, match="indices must be integers, got float32"):
        infer(Node(-1, Op.GATHER, (0, 1), "float32", ()), [ins[0], ("float32", (3,))])
    with pytest.raises(ValueError, match="table of rank 1 or more"):
        infer(Node(-1, Op.GATHER, (0, 1), "float32", ()), [("float32", ()), ins[1]])


@pytest.mark.parametrize("src, dst", [("float32", "int32"), ("float32", "bfloat16"), ("bfloat16", "float32"),
                                      ("int64", "float32"), ("float32", "bool"), ("int32", "int8")])
def test_cast(src: str, dst: str, rng) -> None:
    x = data(rng, (4, 5), "float32") * 50
    x = x.to(TORCH_DTYPES[src])
    g = G()
    y = g.run(g.op(Op.CAST, g.input(x), dtype=dst))
    assert y.dtype == TORCH_DTYPES[dst]
    if src.startswith("float") and dst.startswith("int"):
        assert np.array_equal(y.numpy(), np.trunc(f64(x)).astype(np.int64).astype(y.numpy().dtype))
    elif dst == "bool":
        assert np.array_equal(y.numpy(), f64(x) != 0)
    else:
        assert torch.equal(y, x.to(TORCH_DTYPES[dst]))


def test_const_and_full() -> None:
    g = G()
    c = g.const(0.1, "float32")
    f = g.source(Op.FULL, "int32", (2, 3), value=7)
    b = g.source(Op.FULL, "bool", (4,), value=True)
    y_c, y_f, y_b = g.run([c, f, b])
    assert y_c.dtype == torch.float32 and float(y_c) == float(np.float32(0.1))
    assert y_f.dtype == torch.int32 and y_f.tolist() == [[7] * 3] * 2
    assert y_b.tolist() == [True] * 4
    assert float(G.run(g, c, float64=True)) == 0.1   # float64 mode widens constants exactly


@pytest.mark.parametrize("op", [Op.SHARD, Op.ALL_GATHER, Op.ALL_REDUCE], ids=lambda op: op.value)
def test_collectives_are_identity_in_one_process(op: Op, rng) -> None:
    x = data(rng, (4, 6))
    g = G()
    y = g.run(g.b.add(op, (g.input(x),), "float32", (4, 6), attrs_of(dim=0, reduce="sum")))
    assert torch.equal(y, x)


# ------------------------------------------------------------------------------------ randn

def test_randn_statistics() -> None:
    n = 100_000
    z = counter_randn(20240601, (n,), torch.float64).numpy()
    assert abs(z.mean()) < 5 / math.sqrt(n), z.mean()                # 5 sigma of the sample mean
    assert abs(z.std() - 1) < 0.01, z.std()
    within1, within2 = (np.abs(z) < 1).mean(), (np.abs(z) < 2).mean()
    assert abs(within1 - 0.682689) < 0.01 and abs(within2 - 0.954500) < 0.005, (within1, within2)
    skew, kurt = (z ** 3).mean(), (z ** 4).mean()
    assert abs(skew) < 0.05 and abs(kurt - 3) < 0.1, (skew, kurt)
    assert len(np.unique(z)) > 0.99 * n, "samples repeat"


def test_randn_neighbouring_samples_are_uncorrelated() -> None:
    z = counter_randn(7, (100_000,), torch.float64).numpy()
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.02


def test_randn_bits_are_deterministic() -> None:
    a = counter_randn(42, (1000,), torch.float32)
    b = counter_randn(42, (1000,), torch.float32)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert hashlib.sha256(a.numpy().tobytes()).hexdigest() == hashlib.sha256(b.numpy().tobytes()).hexdigest()


def test_randn_depends_on_seed_and_index_only() -> None:
    flat = counter_randn(5, (24,), torch.float64)
    assert torch.equal(counter_randn(5, (2, 3, 4), torch.float64).reshape(-1), flat)
    assert torch.equal(counter_randn(5, (10,), torch.float64), flat[:10])
    assert torch.equal(counter_randn(5, (24,), torch.bfloat16), flat.to(torch.bfloat16))
    for other in (6, 5 + 2**32, -5):
        assert not torch.equal(counter_randn(other, (24,), torch.float64), flat), f"seed {other} repeats seed 5"


def test_randn_node(rng) -> None:
    g = G()
    seed = g.const(99, "int64")
    y = g.source(Op.RANDN, "bfloat16", (3, 4), seed)
    out32 = G.run(g, y)
    out64 = G.run(g, y, float64=True)
    assert out32.dtype == torch.bfloat16 and torch.equal(out32, counter_randn(99, (3, 4), torch.bfloat16))
    assert out64.dtype == torch.float64 and torch.equal(out64, out32.to(torch.float64))


# ------------------------------------------------------------------------------------ check mode

def test_check_mode_traces_nan_to_the_first_op(rng) -> None:
    g = G()
    x = g.input(torch.tensor([1.0, -1.0, 2.0]))
    two = g.const(2.0, "float32")
    lg = g.op(Op.LOG, x, line=3)
    y = g.op(Op.ADD, g.op(Op.MUL, lg, two, line=4), two, line=5)
    with pytest.raises(ExecutionError, match=r"holds NaN; it first appears in `log` \(node %\d+\) at line 3"):
        g.run(y, check=True)
    assert math.isnan(g.run(y, check=False)[1])


def test_check_mode_follows_the_chosen_side_of_where() -> None:
    """Through `where`, only the positions it takes count: the NaN it drops is no one's fault."""
    g = G()
    x = g.input(torch.tensor([4.0, -4.0]))
    zero = g.const(0.0, "float32")
    cond = g.op(Op.GT, x, zero)
    good = g.op(Op.SQRT, x, line=2)                           # NaN at index 1, dropped
    neg = g.op(Op.NEG, x, line=3)
    bad = g.op(Op.LOG, g.op(Op.SUB, neg, g.const(10.0, "float32")), line=4)   # NaN everywhere, kept at 1
    y = g.op(Op.WHERE, cond, good, bad, line=5)
    with pytest.raises(ExecutionError, match="`log`.*line 4"):
        g.run(y, check=True)
    ok = g.op(Op.WHERE, cond, good, g.op(Op.SQRT, neg, line=6))
    assert g.run(ok, check=True).tolist() == [2.0, 2.0]


def test_check_mode_blames_an_input_with_nan() -> None:
    g = G()
    y = g.op(Op.EXP, g.input(torch.tensor([0.0, math.nan])))
    with pytest.raises(ExecutionError, match="the input `x0`"):
        g.run(y, check=True)


def test_check_mode_ignores_integer_outputs() -> None:
    g = G()
    y = g.op(Op.ADD, g.input(torch.tensor([1, 2])), g.const(1, "int64"))
    assert g.run(y, check=True).tolist() == [2, 3]


def test_freeing_intermediates_gives_the_same_values(rng) -> None:
    g = G()
    x = g.input(data(rng, (8, 8)))
    h = x
    for k in range(10):
        h = g.op(Op.TANH if k % 2 else Op.SIGMOID, g.op(Op.MATMUL, h, x))
    outs = [h, g.op(Op.SUM, h, dim=None)]
    kept = g.run(outs, check=True)
    freed = g.run(outs, check=False)
    assert all(torch.equal(a, b) for a, b in zip(kept, freed))


def test_timings_cover_every_node(rng) -> None:
    g = G()
    y = g.op(Op.EXP, g.op(Op.NEG, g.input(data(rng, (3,))), line=7), line=8)
    out = CpuExecutor(check=True).run(g.graph(y), g.feeds)
    assert [t["op"] for t in out.timings] == ["input", "neg", "exp"]
    assert [t["line"] for t in out.timings] == [None, 7, 8] and all(t["ms"] >= 0 for t in out.timings)
    assert CpuExecutor(timings=False).run(g.graph(y), g.feeds).timings == []
