"""Many GPUs through NCCL: `xgrun --nproc N --device cuda` on 2 and 4 GPUs of this host gives the
float64 single-process result for row-, column- and contracting-sharded matmuls, a tensor-parallel
MLP, a training step of models/train_tiny.xg (tensor parallel, pipelines of 2 and 4 stages, and 2 stages
of 2 GPUs each) and a pipeline with microbatches; with the engine's own kernels on every rank too
(the matmuls and the tensor-parallel step), whole and with their reduced matmuls in row blocks
(XG_COMM_BLOCKS). Each test skips when the host has fewer GPUs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_target import local_target

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


def xg(prog: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"xgbuild.cli.{prog}", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


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
    done = xg("xgc", str(REPO / "models" / "train_tiny.xg"), "--no-kernels", "--num-gpu", str(n), "--sharding",
              str(REPO / "models" / "plans" / f"{plan}.toml"), "--out", str(engine))
    assert done.returncode == 0, done.stderr
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    vals = _train_inputs(engine, gen)
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


@pytest.mark.parametrize("n", [2, 4])
def test_engine_kernels_on_nccl_whole_and_in_row_blocks(tmp_path: Path, n: int) -> None:
    # Every rank launches the engine's kernels (built for this GPU at each rank's shapes), NCCL's
    # collectives between them; XG_COMM_BLOCKS=4 runs each matmul whose product is all-reduced or
    # reduce-scattered in row blocks, each block's collective overlapping the next block.
    need(n)
    target = local_target()
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    cases = []
    (tmp_path / "p.xg").write_text(PROGRAM)
    vals = {"A": torch.randn(512, 1024, generator=gen), "B": torch.randn(1024, 256, generator=gen) / 32,
            "W1": torch.randn(256, 1024, generator=gen) / 16, "W2": torch.randn(1024, 256, generator=gen) / 32}
    cases.append((tmp_path / "p.xg", [], vals))
    # the training step scaled up (blocks are whole tiles of rows), tensor parallel: its partial sums
    # are mostly reduce-scattered
    text = (REPO / "models" / "train_tiny.xg").read_text()
    for name, size in (("T", 512), ("D", 256), ("F", 1024)):
        text = re.sub(rf"^{name} = \d+", f"{name} = {size}", text, flags=re.M)
    text = re.sub(r"^SCALE = .*$", f"SCALE = {256 ** -0.5!r}", text, flags=re.M)
    (tmp_path / "train.xg").write_text(text)
    cases.append((tmp_path / "train.xg", ["--sharding", str(REPO / "models" / "plans" / "train_tensor.toml")], None))
    for k, (src, extra, vals) in enumerate(cases):
        engine = tmp_path / f"e{k}.xge"
        done = xg("xgc", str(src), "--target", target, "--tune", "predict", "--num-gpu", str(n), *extra,
                  "--out", str(engine))
        assert done.returncode == 0, done.stderr
        if vals is None:
            vals = _train_inputs(engine, gen)
        save_tensors(tmp_path / "in.safetensors", vals)
        ref = Engine.load(engine).run(vals, float64=True).tensors
        for blocks in ("1", "4"):
            out = tmp_path / f"o{k}_{blocks}.safetensors"
            done = xg("xgrun", str(engine), "--nproc", str(n), "--device", "cuda", "--inputs",
                      str(tmp_path / "in.safetensors"), "--output", str(out), "--json", env={"XG_COMM_BLOCKS": blocks})
            assert done.returncode == 0, done.stderr
            summary = json.loads(done.stdout)
            assert summary["executor"] == "spmd-kernels-cuda"
            assert (summary["comm"]["split_collectives"] > 0) == (blocks == "4"), summary["comm"]
            got = load_tensors(out)
            for name, want in ref.items():
                assert rel(got[name], want) < 1e-3, (src.name, blocks, name)


def _train_inputs(engine: Path, gen: torch.Generator) -> dict[str, torch.Tensor]:
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
    return vals
