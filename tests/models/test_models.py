"""models/train_tiny.xg and models/infer.xg: the transformer's forward pass and gradients against a
torch reference in float64, and a real training run through xg.run_engine on the CPU."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xg
from model_sources import gradient_source
from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_source

REPO = Path(__file__).resolve().parents[2]
PARAMS = ["EMB", "G1", "WQ", "WK", "WV", "WO", "G2", "W1", "W2", "GF", "HEAD"]
V, D, F_, T = 16, 32, 64, 32


def init_params(gen: torch.Generator, dtype=torch.float32) -> dict:
    shapes = {"EMB": (V, D), "G1": (D,), "WQ": (D, D), "WK": (D, D), "WV": (D, D), "WO": (D, D), "G2": (D,),
              "W1": (D, F_), "W2": (F_, D), "GF": (D,), "HEAD": (D, V)}
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
        else:
            out[name] = (torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[0])).to(dtype)
    return out


def torch_forward(p: dict, tokens: torch.Tensor) -> torch.Tensor:
    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * g

    x = F.one_hot(tokens, V).to(p["EMB"].dtype) @ p["EMB"]
    a = rms(x, p["G1"])
    q, k, v = a @ p["WQ"], a @ p["WK"], a @ p["WV"]
    causal = torch.arange(T)[:, None] >= torch.arange(T)[None, :]
    scores = torch.where(causal, (q @ k.T) * (1 / math.sqrt(D)), torch.tensor(-1e9, dtype=q.dtype))
    h = x + (torch.softmax(scores, 1) @ v) @ p["WO"]
    h = h + F.gelu(rms(h, p["G2"]) @ p["W1"]) @ p["W2"]
    return rms(h, p["GF"]) @ p["HEAD"]


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic task: each token is followed by the next one, modulo V."""
    start = torch.randint(0, V, (1,), generator=gen)
    seq = (start + torch.arange(T + 1)) % V
    return seq[:-1], seq[1:]


def test_infer_matches_torch() -> None:
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    engine = xg.compile_file(REPO / "models" / "infer.xg")
    params = init_params(gen)
    tokens = torch.randint(0, V, (T,), generator=gen)
    got = xg.run_engine(engine, {"TOKENS": tokens, **params}).value
    ref = torch_forward({k: v.double() for k, v in params.items()}, tokens)
    assert float((got.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-6), ("float32", 1e-4)])
def test_whole_model_gradients_match_torch(tmp_path: Path, dtype: str, tol: float) -> None:
    # The same model (in float64, through a float64 copy of std.nn, or as written), returning the
    # loss and the gradients; torch's reference runs in float64.
    path = gradient_source("train_tiny.xg", tmp_path, dtype, PARAMS)
    engine = xg.compile_file(path)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    params = init_params(gen, getattr(torch, dtype))
    tokens, targets = batch(gen)
    inputs = {"TOKENS": tokens, "TARGETS": targets, **params}
    loss, grads = engine.run(inputs).value

    leaves = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    ref = F.cross_entropy(torch_forward(leaves, tokens), targets)
    ref.backward()
    assert abs(loss - ref.item()) < tol * max(1.0, abs(ref.item()))
    for name, g in zip(PARAMS, grads):
        want = leaves[name].grad
        assert float((g.double() - want).norm() / want.norm()) < tol, name


def train(engine, steps: int, seed: int) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    params = init_params(gen)
    state = {f"M_{k}": torch.zeros_like(v) for k, v in params.items()}
    state |= {f"V_{k}": torch.zeros_like(v) for k, v in params.items()}
    losses = []
    for step in range(1, steps + 1):
        tokens, targets = batch(gen)
        inputs = {"TOKENS": tokens, "TARGETS": targets, "STEP": torch.tensor(float(step)), "LR": torch.tensor(0.01)}
        loss, new_p, new_m, new_v = xg.run_engine(engine, {**inputs, **params, **state}).value
        params = dict(zip(PARAMS, new_p))
        state = {f"M_{k}": m for k, m in zip(PARAMS, new_m)} | {f"V_{k}": v for k, v in zip(PARAMS, new_v)}
        losses.append(loss)
    return losses


def test_training_learns_and_is_bit_reproducible() -> None:
    engine = xg.compile_file(REPO / "models" / "train_tiny.xg")
    seed = int(np.random.SeedSequence().entropy % 2**31)
    first = train(engine, 60, seed)
    assert first[-1] < first[0] / 10, f"seed {seed}: loss {first[0]:.4f} -> {first[-1]:.4f}"
    again = train(xg.compile_file(REPO / "models" / "train_tiny.xg"), 60, seed)
    assert [np.float32(x).tobytes() for x in first] == [np.float32(x).tobytes() for x in again]


def test_dropout_is_seeded_and_keeps_the_right_fraction() -> None:
    src = ("import std.nn\nextern Tensor[float32, 64, 64] X\n"
           "def main() {\n    return dropout(X, 0.75, 11), dropout(X, 0.75, 11), dropout(X, 0.75, 12)\n}\n")
    engine = engine_of(compile_source(src, str(REPO / "models" / "dropout_probe.xg")))
    x = torch.rand(64, 64) + 0.5
    a, b, c = engine.run({"X": x}).value
    assert torch.equal(a, b) and not torch.equal(a, c)
    kept = (a != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.03
    torch.testing.assert_close(a[a != 0], (x / 0.75)[a != 0])
