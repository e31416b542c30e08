"""float32 attention's `TF32X3` config compiled for this GPU: both products as three TF32
tensor-core products keep float32's accuracy against the float64 reference (one TF32 product
alone would be off by about 1e-3), as the exact (`ieee`) config does, on causal and non-causal
heads of 64 with a key count no block divides."""

from __future__ import annotations

import pytest
import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.driver import compile_source

pytestmark = pytest.mark.gpu

SOURCE = """B = 2
H = 3
T = 200
D = 64
extern Tensor[float32, B, H, T, D] Q
extern Tensor[float32, B, H, T, D] K
extern Tensor[float32, B, H, T, D] V
extern Tensor[float32, B, H, T, D] K2
def main() {
    causal = reshape(arange(T), [T, 1]) >= reshape(arange(T), [1, T])
    return softmax((Q @ transpose(K)) * 0.125, dim=3) @ V, softmax(where(causal, (Q @ transpose(K2)) * 0.125, -1e9), dim=3) @ V
}
"""


@pytest.mark.parametrize("x3", [0, 1], ids=["ieee", "tf32x3"])
def test_float32_attention_products_keep_float32_accuracy(x3: int) -> None:
    graph = compile_source(SOURCE, "attention32.xg").optimized.main
    seen: list[dict] = []

    def choose(job, config):
        if job.spec.kind != "attention":
            return config
        forced = {**config, "BLOCK_M": 64, "BLOCK_N": 64, "TF32X3": x3, "num_warps": 4, "num_stages": 2}
        seen.append(forced)
        return forced
    g = torch.Generator().manual_seed(x3)
    values = {k: torch.randn(2, 3, 200, 64, generator=g) for k in ("Q", "K", "V", "K2")}
    report = check_graph(graph, values, {}, target="H100", choose=choose, device="cuda")
    assert len(seen) == 2 and all(c["TF32X3"] == x3 for c in seen)
    assert len(report) == 2
    for out in report:
        assert out["rel_err"] < 1e-5, out
