"""Imports `scaled_dot_product_attention` under a mask built the way `transformers` builds one
(positions as `arange(T) + 0`, `ones & (col <= row)`, and-ed with a padding mask gathered per
batch row), with the first half of batch row 0 padded on the left: those queries have no key at
all. Runs the kernels under Triton's interpreter (CPU) against the float64 CPU reference and prints,
as JSON, the schedule's kernels and each output's error. A script, not a test: TRITON_INTERPRET must
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


class MaskedAttention(torch.nn.Module):
    def forward(self, q, k, v, pad):
        rows = (torch.arange(q.shape[-2]) + 0)[:, None]
        cols = (torch.arange(k.shape[-2]) + 0)[None, :]
        causal = torch.ones((), dtype=torch.bool) & (cols <= rows)
        keep = causal[None, None] & pad.bool()[torch.arange(q.shape[0])[:, None], cols][:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    pad = torch.ones(B, T, dtype=torch.long)
    pad[0, : T // 2] = 0                # left padding: batch row 0's first T/2 queries see no key
    return q, k, v, pad


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import kernel_specs
    from xgbuild.compiler.codegen.triton_attention import causal
    from xgbuild.compiler.importers.torch_export import import_torch
    imported = import_torch(MaskedAttention(), inputs(0))
    graph = imported.optimized.main
    specs = [spec for spec, _b in kernel_specs(schedule(graph))]
    values = dict(zip(imported.inputs, inputs(1)))
    values.update(imported.weights)
    report = check_graph(graph, values, {})
    print(json.dumps({"kinds": [s.kind for s in specs],
                      "causal": [causal(s) for s in specs if s.kind == "attention"],
                      "operands": [[list(o) for o in s.operands] for s in specs if s.kind == "attention"],
                      "outputs": report}))


if __name__ == "__main__":
    main()
