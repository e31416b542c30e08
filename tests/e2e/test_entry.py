"""Entry points other than `main` (`xgc --entry`, `xg.compile_file(entry=...)`, Bazel's `entry`):
the function's parameters become the engine's inputs, checked and computed like `main`'s."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, write_program

import xg

PROGRAM = """
def loss(Tensor[float32, B, D] x, Tensor[float32, D, C] w, Tensor[float32, B, C] y) -> float32 {
    d = x @ w - y
    return mean(d * d)
}
def scaled(float32 a, Tensor[float64, N] v) -> Tensor[float64, N] {
    return exp(v) * cast(a, float64)
}
def pair(Result[float32] r) -> float32 {
    return r.unwrap_or(0.0)
}
def main() {
    return 1.0
}
"""


@pytest.fixture
def program(tmp_path):
    return write_program(tmp_path, PROGRAM, "entries.xg")


def test_an_entry_function_is_the_engine(program):
    engine = xg.compile_file(program, entry="loss", kernels=False)
    assert [s["name"] for s in engine.signature] == ["x", "w", "y"]
    g = torch.Generator().manual_seed(7)
    x, w, y = (torch.randn(s, generator=g) for s in ((5, 3), (3, 4), (5, 4)))
    got = xg.run_engine(engine, {"x": x, "w": w, "y": y}).value
    ref = ((x.double().numpy() @ w.double().numpy() - y.double().numpy()) ** 2).mean()
    assert abs(float(got) - ref) / abs(ref) < 1e-5
    with pytest.raises(xg.InputError, match="`w`"):
        xg.run_engine(engine, {"x": x, "w": w[:2], "y": y})

    scaled = xg.compile_file(program, entry="scaled", kernels=False)
    v = torch.randn(6, generator=g, dtype=torch.float64)
    out = xg.run_engine(scaled, {"a": torch.tensor(2.5), "v": v}).value
    ref = np.exp(v.numpy()) * 2.5
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-12


def test_bad_entries_are_compile_errors(program):
    with pytest.raises(xg.CompileError, match=r"error\[XG0017\]: no function `nowhere`"):
        xg.compile_file(program, entry="nowhere", kernels=False)
    with pytest.raises(xg.CompileError, match="must be tensors or scalars"):
        xg.compile_file(program, entry="pair", kernels=False)
    with pytest.raises(xg.XGError, match="entry must name a function"):
        xg.compile_file(program, entry="not a name", kernels=False)


def test_xgc_entry_builds_kernels_and_xgrun_runs_it(program, tmp_path):
    out = tmp_path / "loss.xge"
    cmd = [sys.executable, "-m", "xgbuild.cli.xgc", str(program), "--entry", "loss", "--target", "GB200",
           "--tune", "predict", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr
    manifest = xg.load_engine(out).manifest
    assert [i["name"] for i in manifest["entry"]["inputs"]] == ["x", "w", "y"]
    assert manifest["kernels"] and {v["arch"] for k in manifest["kernels"] for v in k["variants"]} == {100}
    res = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgrun", str(out), "--seed", "3", "--dim", "B=4",
                          "--dim", "D=8", "--dim", "C=2"], capture_output=True, text=True, timeout=300,
                         cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr
