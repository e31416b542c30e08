"""Many GPUs through NCCL: `xgrun --nproc N --device cuda` on 2 and 4 GPUs of this host gives the
float64 single-process result for row-, column- and contracting-sharded matmuls, a tensor-parallel
MLP, a training step of models/train.xg (tensor parallel, pipelines of 2 and 4 stages, and 2 stages
of 2 GPUs each) and a pipeline with microbatches. Each test skips when the host has fewer GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from xgbuild.runtime.engine import Engine
from xgbuild.runtime.tensor_io import load_tensors, save_tensors

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
TOL = 1e-4          # float32 on the GPU against float64 (TF32 stays off for float32 matmuls)

PROGRAM = """
extern Tensor[float32, 512, 1024] A
extern Tensor[float32, 1024, 256] B
extern Tensor[float32, 256, 1024] W1
extern Tensor[float32, 1024, 256] W2
def rows(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {
    with shard(a, dim=0):
        c = a @ b
    return c
}
def cols(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {
    with shard(b, dim=1):
        c = a @ b
    return c
}
def contract(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {
    with shard(a, dim=1), shard(b, dim=0):
        c = a @ b
    return c
}
def main() {
    c = contract(A, B)
    with shard(W1, dim=1), shard(W2, dim=0):
        y = gelu(c @ W1) @ W2
    return (rows(A, B), cols(A, B), c, y)
}
"""


def need(n: int) -> None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < n:
        pytest.skip(f"needs {n} GPUs, this host has {have}")


def xg(prog: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"xgbuild.cli.{prog}", *args], capture_output=True, text=True,
                          timeout=600)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("n", [2, 4])
def test_sharded_matmuls_and_mlp_on_nccl(tmp_path: Path, n: int) -> None:
    need(n)
    (tmp_path / "p.xg").write_text(PROGRAM)
    done = xg("xgc", str(tmp_path / "p.xg"), "--no-kernels", "--num-gpu", str(n), "--out", str(tmp_path / "p.xge"))
    assert done.returncode == 0, done.stderr
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    vals = {"A": torch.randn(512, 1024, generator=gen), "B": torch.randn(1024, 256, generator=gen) / 32,
            "W1": torch.randn(256, 1024, generator=gen) / 16, "W2": torch.randn(1024, 256, generator=gen) / 32}
    save_tensors(tmp_path / "in.safetensors", vals)
    done = xg("xgrun", str(tmp_path / "p.xge"), "--nproc", str(n), "--device", "cuda", "--inputs",
              str(tmp_path / "in.safetensors"), "--output", str(tmp_path / "o.safetensors"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["world_size"] == n
    got = load_tensors(tmp_path / "o.safetensors")
    ref = Engine.load(tmp_path / "p.xge").run(vals, float64=True).tensors
    for name, want in ref.items():
        assert rel(got[name], want) < TOL, name


@pytest.mark.parametrize("n,plan", [(2, "train_tensor"), (4, "train_tensor"), (2, "train_pipeline"),
                                    (4, "train_pipeline4"), (4, "train_pipeline_dp")])
def test_training_step_on_nccl(tmp_path: Path, n: int, plan: str) -> None:
    need(n)
    engine = tmp_path / "train.xge"
    done = xg("xgc", str(REPO / "models" / "train.xg"), "--no-kernels", "--num-gpu", str(n), "--sharding",
              str(REPO / "models" / "plans" / f"{plan}.toml"), "--out", str(engine))
    assert done.returncode == 0, done.stderr
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    vals = {}
    for spec in Engine.load(engine).signature:
        shape = tuple(spec["shape"])
        if spec["dtype"] == "int64":
            vals[spec["name"]] = torch.randint(0, 16, shape, generator=gen)
        elif spec["name"].startswith("V_"):
            vals[spec["name"]] = torch.rand(shape, generator=gen) * 1e-3 + 1e-3
        elif spec["name"] in ("STEP", "LR"):
            vals[spec["name"]] = torch.tensor(3.0 if spec["name"] == "STEP" else 0.01)
        else:
            vals[spec["name"]] = torch.randn(shape, generator=gen) * 0.1
    save_tensors(tmp_path / "in.safetensors", vals)
    done = xg("xgrun", str(engine), "--nproc", str(n), "--device", "cuda", "--inputs", str(tmp_path / "in.safetensors"),
              "--output", str(tmp_path / "o.safetensors"))
    assert done.returncode == 0, done.stderr
    got = load_tensors(tmp_path / "o.safetensors")
    ref = Engine.load(engine).run(vals, float64=True).tensors
    for name, want in ref.items():
        assert rel(got[name], want) < TOL, name


@pytest.mark.parametrize("n", [2, 4])
def test_pipeline_with_microbatches_on_nccl(tmp_path: Path, n: int) -> None:
    # A layer per stage, 4 microbatches (per replica): point-to-point sends on NCCL, posted in the
    # agreed order; on 4 GPUs each stage has 2 GPUs, whose replicas sum their gradients (NCCL
    # collectives in each stage's group between the sends).
    need(n)
    engine = tmp_path / "pipeline.xge"
    done = xg("xgc", str(REPO / "examples" / "pipeline.xg"), "--no-kernels", "--sharding",
              str(REPO / "examples" / "pipeline.toml"), "--num-gpu", str(n), "--out", str(engine))
    assert done.returncode == 0, done.stderr
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    vals = {"X": torch.randn(64, 32, generator=gen), "Y": torch.randn(64, 8, generator=gen),
            "W1": torch.randn(32, 16, generator=gen) * 0.3, "W2": torch.randn(16, 8, generator=gen) * 0.3}
    save_tensors(tmp_path / "in.safetensors", vals)
    done = xg("xgrun", str(engine), "--nproc", str(n), "--device", "cuda", "--inputs", str(tmp_path / "in.safetensors"),
              "--output", str(tmp_path / "o.safetensors"), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["executor"] == "pipeline-cuda" and summary["comm"]["microbatches"] == 4
    got = load_tensors(tmp_path / "o.safetensors")
    ref = Engine.load(engine).run(vals, float64=True).tensors
    for name, want in ref.items():
        assert rel(got[name], want) < TOL, name
