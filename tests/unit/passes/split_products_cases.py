"""Shared by test_split_products.py and interpret_split_products.py: a program whose products take
each form of passes/split_products.py on a GPU of 4 SMs (`small_gpu`), and the pipeline run for it."""

from __future__ import annotations

from dataclasses import replace

import torch

from xgbuild.build.target import target_profile
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.passes.pipeline import run_pipeline

# On 4 SMs of an H200's per-SM rate, with K = 1024:
# - transpose(X) @ DY, [384, 256]: 6 tiles, a wave and 2: the top 256 rows whole, the tail's 128
#   rows in 2 parts along K (gradients' x^T, A a transposed view);
# - XR @ transpose(Y), [256, 384]: the same by columns (B an `nn.Linear` weight's transpose);
# - transpose(Z) @ Z2, [128, 128]: one tile, split whole in 2;
# - X32 @ W32 (float32) and a product whose K is short stay whole.
SOURCE = """extern Tensor[bfloat16, 1024, 384] X
extern Tensor[bfloat16, 1024, 256] DY
extern Tensor[bfloat16, 256, 1024] XR
extern Tensor[bfloat16, 384, 1024] Y
extern Tensor[bfloat16, 1024, 128] Z
extern Tensor[bfloat16, 1024, 128] Z2
extern Tensor[float32, 128, 1024] X32
extern Tensor[float32, 1024, 128] W32
extern Tensor[bfloat16, 64, 128] S
def main() {
    return (transpose(X) @ DY, XR @ transpose(Y), transpose(Z) @ Z2, X32 @ W32,
            cast(transpose(X) @ DY, float32) * 0.5, transpose(Z) @ (Z2 @ transpose(S)))
}
"""
SHAPES = {"X": (1024, 384), "DY": (1024, 256), "XR": (256, 1024), "Y": (384, 1024), "Z": (1024, 128),
          "Z2": (1024, 128), "X32": (128, 1024), "W32": (1024, 128), "S": (64, 128)}


def small_gpu(sm_count: int = 4):
    """An H200 of `sm_count` SMs, each as fast as an H200's."""
    hw = target_profile("H200")
    scale = sm_count / hw.sm_count
    return replace(hw, sm_count=sm_count, peak_flops=replace(hw.peak_flops, bf16=hw.peak_flops.bf16 * scale),
                   measured=replace(hw.measured, bf16_matmul_flops_per_s=None))


def optimized(profile=None, source: str = SOURCE):
    """The optimised graph of `source` with `profile` (default `small_gpu()`) as the target's."""
    lowered = compile_source(source, "split.xg", stop_after="precision").lowered
    return run_pipeline(replace(lowered, profile=profile or small_gpu()), verify_each=True).main


def inputs(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(s, generator=gen) * 0.5).to(torch.float32 if k.endswith("32") else torch.bfloat16)
            for k, s in SHAPES.items()}


def reference(values: dict) -> list[torch.Tensor]:
    v = {k: t.double() for k, t in values.items()}
    xdy = v["X"].T @ v["DY"]
    return [xdy, v["XR"] @ v["Y"].T, v["Z"].T @ v["Z2"], v["X32"] @ v["W32"], xdy * 0.5,
            v["Z"].T @ (v["Z2"] @ v["S"].T)]
