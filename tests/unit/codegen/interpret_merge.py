"""Element-wise kernels that merge: rotary position embeddings as `transformers` writes them
(`q * cos + rotate_half(q) * sin`, rotate_half a `cat` of negated and plain halves), a graph
where merging two kernels would close a cycle through a matmul, and one whose sum reads the other
kernel's value transposed. Imports each, runs its kernels
under Triton's interpreter (CPU) against the float64 CPU reference, and prints as JSON each
model's kernels (kind, shape, ops) and each output's error. A script, not a test: TRITON_INTERPRET
must be set before Triton is imported, so the test runs it in a fresh process.

    python tests/unit/codegen/interpret_merge.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        cos, sin = cos[:, None], sin[:, None]          # [B, 1, T, D] over the heads
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Cycle(torch.nn.Module):
    def forward(self, x, w):
        a = x * 2.0
        b = F.pad(a @ w, (1, 1))        # read at other positions: a kernel of its own, after the matmul
        return a + b


class Viewed(torch.nn.Module):
    def forward(self, x, y):
        return x * 2.0 + (y + 1.0).t()      # y + 1 read transposed: never merged into the sum's kernel


def rotary_inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 4, 24, 32, generator=g), torch.randn(2, 2, 24, 32, generator=g)
    angles = torch.randn(2, 24, 32, generator=g)
    return q, k, angles.cos(), angles.sin()


def cycle_inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 34, generator=g), torch.randn(34, 32, generator=g)


def viewed_inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(40, 40, generator=g), torch.randn(40, 40, generator=g)


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.importers.torch_export import import_torch
    report = {}
    for name, model, make in (("rotary", Rotary(), rotary_inputs), ("cycle", Cycle(), cycle_inputs),
                              ("viewed", Viewed(), viewed_inputs)):
        imported = import_torch(model, make(0))
        graph = imported.optimized.main
        kernels = [(k.kind, list(k.shape), sorted({graph.node(n).op.value for n in k.nodes}))
                   for k in schedule(graph).kernels]
        values = dict(zip(imported.inputs, make(1)))
        values.update(imported.weights)
        report[name] = {"kernels": kernels, "outputs": check_graph(graph, values, {})}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
