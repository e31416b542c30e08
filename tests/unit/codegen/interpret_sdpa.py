"""Imports `scaled_dot_product_attention` under a mask built the way `transformers` builds one
(positions as `arange(T) + 0`, `ones & (col <= row)`, and-ed with a padding mask gathered per
batch row), with the first half of batch row 0 padded on the left: those queries have no key at
all; and the same with grouped-query attention, keys and values of KVH heads repeated to H the way
transformers' `repeat_kv` does. Runs the kernels under Triton's interpreter (CPU) against the
float64 CPU reference and prints, as JSON, the schedule's kernels and each output's error. A script, not a test: TRITON_INTERPRET must
be set before Triton is imported, so the test runs it in a fresh process.

    python tests/unit/codegen/interpret_sdpa.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret

B, H, T, D = 2, 2, 96, 32
KVH, GROUP = 2, 3                       # grouped-query attention: 2 key heads, each for 3 query heads


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' repeat_kv: [B, KVH, S, D] -> [B, KVH * n, S, D]."""
    b, kvh, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)


class MaskedAttention(torch.nn.Module):
    def __init__(self, group: int = 1) -> None:
        super().__init__()
        self.group = group

    def forward(self, q, k, v, pad):
        rows = (torch.arange(q.shape[-2]) + 0)[:, None]
        cols = (torch.arange(k.shape[-2]) + 0)[None, :]
        causal = torch.ones((), dtype=torch.bool) & (cols <= rows)
        keep = causal[None, None] & pad.bool()[torch.arange(q.shape[0])[:, None], cols][:, None, None, :]
        if self.group > 1:
            k, v = repeat_kv(k, self.group), repeat_kv(v, self.group)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def inputs(seed: int, group: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    heads = KVH * group if group > 1 else H
    q = torch.randn(B, heads, T, D, generator=g)
    k, v = (torch.randn(B, heads // group, T, D, generator=g) for _ in range(2))
    pad = torch.ones(B, T, dtype=torch.long)
    pad[0, : T // 2] = 0                # left padding: batch row 0's first T/2 queries see no key
    return q, k, v, pad


def report(group: int) -> dict:
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import kernel_specs
    from xgbuild.compiler.codegen.triton_attention import causal
    from xgbuild.compiler.importers.torch_export import import_torch
    imported = import_torch(MaskedAttention(group), inputs(0, group))
    graph = imported.optimized.main
    specs = [spec for spec, _b in kernel_specs(schedule(graph))]
    values = dict(zip(imported.inputs, inputs(1, group)))
    values.update(imported.weights)
    return {"kinds": [s.kind for s in specs],
            "causal": [causal(s) for s in specs if s.kind == "attention"],
            "operands": [[list(o) for o in s.operands] for s in specs if s.kind == "attention"],
            "outputs": check_graph(graph, values, {})}


def main() -> None:
    interpret.enable()
    print(json.dumps({**report(1), "gqa": report(GROUP)}))


if __name__ == "__main__":
    main()
