"""Every example program, run on the CPU, against a float64 numpy reference written by hand.

Fresh random data and sizes in each test (the data seed is in every failure message). Programs
in float32 must be within 1e-5 relative norm error; bfloat16 ones within 2e-2, their reference
computed in float64 from the bf16-rounded inputs. The CPU executor's `float64=True` mode must
match the same reference to 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    EXAMPLE_NAMES,
    EXAMPLES,
    FLOAT64_MODE_TOL,
    TOLERANCE,
    Rand,
    assert_close,
    attention,
    mlp,
    rmsnorm,
    softmax,
)

import xg


def case_attention(rand: Rand):
    s, d = rand.size(2, 24), rand.size(2, 32)
    (q, q64), (k, k64), (v, v64) = (rand.tensor((s, d), "bfloat16") for _ in range(3))
    return {"Q": q, "K": k, "V": v}, attention(q64, k64, v64, 0.125), "bfloat16"


def case_cluster_matmul(rand: Rand):
    # NUM_GPU = 2 shards A's rows and B's columns: keep those dims even.
    m, k, n = rand.size(2, 20, even=True), rand.size(1, 20), rand.size(2, 20, even=True)
    (a, a64), (b, b64) = rand.tensor((m, k)), rand.tensor((k, n))
    return {"A": a, "B": b}, a64 @ b64, "float32"


def case_contract(rand: Rand):
    t, k, d = rand.size(1, 16), rand.size(1, 16), rand.size(2, 16)
    (a, a64), (b, b64), (w, w64) = rand.tensor((t, k)), rand.tensor((k, d)), rand.tensor((d,))
    return {"A": a, "B": b, "W": w}, softmax(rmsnorm(a64 @ b64, w64, 1e-5), axis=1), "float32"


def case_mlp(rand: Rand):
    t, d, f = rand.size(2, 16), rand.size(8, 32), rand.size(16, 64)
    (x, x64), (w1, w164), (b1, b164), (w2, w264) = (rand.tensor((t, d), "bfloat16"),
                                                     rand.tensor((d, f), "bfloat16", scale=d ** -0.5),
                                                     rand.tensor((f,), "bfloat16"),
                                                     rand.tensor((f, d), "bfloat16", scale=f ** -0.5))
    return {"X": x, "W1": w1, "B1": b1, "W2": w2}, mlp(x64, w164, b164, w264), "bfloat16"


def case_norms(rand: Rand):
    t, d = rand.size(1, 16), rand.size(2, 32)
    (x, x64), (g, g64) = rand.tensor((t, d), scale=3.0), rand.tensor((d,))
    return {"X": x, "G": g}, softmax(rmsnorm(x64, g64, 1e-6), axis=1), "float32"


CASES = {"attention": case_attention, "cluster_matmul": case_cluster_matmul, "contract": case_contract,
         "mlp": case_mlp, "norms": case_norms}
TENSOR_EXAMPLES = sorted(CASES)


def test_every_example_has_a_reference() -> None:
    assert set(EXAMPLE_NAMES) == set(CASES) | {"safe_div", "data_parallel", "pipeline"}, \
        "a new example needs a float64 reference here"


def data_parallel_reference(x, y, w1, w2):
    """One SGD step of a ReLU MLP under mean squared error, by hand (examples/data_parallel.xg)."""
    h = x @ w1
    a = np.maximum(h, 0)
    d = a @ w2 - y
    dd = 2 * d / d.size
    gw2 = a.T @ dd
    gw1 = x.T @ ((dd @ w2.T) * (h > 0))
    return [np.array((d * d).mean()), w1 - 0.1 * gw1, w2 - 0.1 * gw2]


def data_parallel_case(rand: Rand):
    shapes = {"X": (64, 32), "Y": (64, 8), "W1": (32, 16), "W2": (16, 8)}
    vals = {k: rand.tensor(s, scale=0.3 if k.startswith("W") else 1.0) for k, s in shapes.items()}
    return {k: t for k, (t, _) in vals.items()}, data_parallel_reference(*(vals[k][1] for k in shapes))


def test_data_parallel_example_matches_float64_reference(rand: Rand, example_engines) -> None:
    inputs, refs = data_parallel_case(rand)
    for got, ref in zip(xg.run_engine(example_engines["data_parallel"], inputs).value, refs):
        assert_close(got, ref, 1e-5, rand, "data_parallel (one process)")


def test_pipeline_example_matches_float64_reference_in_one_process_and_on_two_ranks(rand: Rand) -> None:
    # examples/pipeline.xg is data_parallel.xg's training step with a layer per GPU and its batch in
    # 4 microbatches (examples/pipeline.toml); with or without the plan, one step is the same math.
    engine = xg.compile_file(EXAMPLES / "pipeline.xg", sharding=EXAMPLES / "pipeline.toml", kernels=False)
    inputs, refs = data_parallel_case(rand)
    for how, result in (("one process", xg.run_engine(engine, inputs)),
                        ("2 ranks", xg.run_engine(engine, inputs, nproc=2))):
        for got, ref in zip(result.value, refs):
            assert_close(got, ref, 1e-5, rand, f"pipeline example ({how})")


@pytest.mark.parametrize("name", TENSOR_EXAMPLES)
def test_example_matches_float64_reference(name: str, rand: Rand, example_engines) -> None:
    engine = example_engines[name]
    inputs, ref, dtype = CASES[name](rand)
    result = xg.run_engine(engine, external_values=inputs)
    y = result.value
    assert isinstance(y, torch.Tensor) and y.dtype == getattr(torch, dtype), f"{name}: got {type(y)} {y.dtype}"
    assert tuple(y.shape) == ref.shape
    assert bool(torch.isfinite(y).all())
    assert_close(y, ref, TOLERANCE[dtype], rand, f"{name} ({dtype})")


@pytest.mark.parametrize("name", TENSOR_EXAMPLES)
def test_example_float64_mode_matches_reference(name: str, rand: Rand, example_engines) -> None:
    engine = example_engines[name]
    inputs, ref, _ = CASES[name](rand)
    result = engine.run(inputs, float64=True)
    assert result.value.dtype == torch.float64
    assert result.metadata["executor"].endswith("float64")
    assert_close(result.value, ref, FLOAT64_MODE_TOL, rand, f"{name} in float64 mode")


@pytest.mark.parametrize("name", TENSOR_EXAMPLES)
def test_example_check_mode_does_not_change_values(name: str, rand: Rand, example_engines) -> None:
    engine = example_engines[name]
    inputs, _, _ = CASES[name](rand)
    checked = engine.run(inputs, check=True).value
    unchecked = engine.run(inputs, check=False).value
    assert torch.equal(checked, unchecked), f"check mode changed the result (seed {rand.seed})"


def test_safe_div_example_values(example_engines) -> None:
    x, z, h = xg.run_engine(example_engines["safe_div"]).value
    assert (x, z, h) == (30, -1.0, 0.5)
    assert type(x) is int and type(z) is float and type(h) is float


def test_cluster_matmul_metadata(rand: Rand, example_engines) -> None:
    inputs, _, _ = case_cluster_matmul(rand)
    meta = xg.run_engine(example_engines["cluster_matmul"], external_values=inputs).metadata
    assert meta["num_gpu"] == 2 and meta["target"] == "H100" and meta["device"] == "cpu"
    m, k = inputs["A"].shape
    assert meta["specialization"]["symbols"] == {"M": m, "K": k, "N": inputs["B"].shape[1]}
    shards = {(s["name"], s["dim"]) for s in example_engines["cluster_matmul"].manifest["sharding"]}
    assert shards == {("A", 0), ("B", 1)}


def test_safe_div_example_targets_gb200(example_engines) -> None:
    meta = xg.run_engine(example_engines["safe_div"]).metadata
    assert (meta["target"], meta["num_gpu"]) == ("GB200", 8)


def test_contract_program_from_the_front_end_issue(rand: Rand) -> None:
    """examples/contract.xg as a user compiles it: a fresh compile, bigger sizes, both float modes."""
    engine = xg.compile_file(EXAMPLES / "contract.xg")
    t, k, d = 33, 17, 65
    (a, a64), (b, b64), (w, w64) = rand.tensor((t, k)), rand.tensor((k, d)), rand.tensor((d,))
    ref = softmax(rmsnorm(a64 @ b64, w64, 1e-5), axis=1)
    assert_close(engine.run({"A": a, "B": b, "W": w}).value, ref, TOLERANCE["float32"], rand, "contract")
    assert_close(engine.run({"A": a, "B": b, "W": w}, float64=True).value, ref, FLOAT64_MODE_TOL, rand,
                 "contract float64")
    assert np.allclose(ref.sum(axis=1), 1.0)
