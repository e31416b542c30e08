"""test_remat.py's LayerNorm block at fixed sizes through its kernels under Triton's interpreter
(CPU), against the float64 reference: the per-row values its backward recomputes (1 / sqrt(var +
eps)) are computed and written by the forward row kernel (`schedule.TINY_REMAT`). Prints, as JSON,
whether a forward row kernel holds recomputed values and each output's error. A script, not a
test: TRITON_INTERPRET must be set before Triton is imported.

    python tests/unit/passes/interpret_remat.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    from test_remat import SIZED_BLOCK

    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_source
    g = compile_source(SIZED_BLOCK, "block.xg").optimized.main
    joined = [k.kind for k in schedule(g).kernels
              if k.anchor is not None and not g.node(k.anchor).attr("remat")
              and any(g.node(n).attr("remat") for n in k.nodes)
              and any(g.node(n).op.value == "rsqrt" and not g.node(n).attr("remat") for n in k.nodes)]
    runs = []
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        runs.append({"X": torch.randn(256, 64, generator=gen), "W": torch.randn(64, 128, generator=gen) * 0.1,
                     "C": torch.randn(128, generator=gen) * 0.1})
    out = check_graph(g, runs, {})
    print(json.dumps({"joined": joined, "errors": [r["rel_err"] for r in out]}))


if __name__ == "__main__":
    main()
