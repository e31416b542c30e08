"""A matmul whose epilogue is a whole tanh-GELU and a residual add (the value read four times stays
in registers: `sink_reshapes` and the matmul template's join rule) under Triton's interpreter (CPU):
prints, as JSON, the kernels the schedule made and the error of each output against float64 torch.
A script, not a test: TRITON_INTERPRET must be set before Triton is imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from interpret_gather import generic_plans  # noqa: E402

from xgbuild.compiler.codegen.schedule import schedule  # noqa: E402
from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402
from xgbuild.runtime import interpret  # noqa: E402

SOURCE = """extern Tensor[float32, 2, 8, 16] X
extern Tensor[float32, 16, 24] W
extern Tensor[float32, 24] B
extern Tensor[float32, 2, 8, 24] R
def main() {
    h = reshape(reshape(X, [16, 16]) @ W + B, [2, 8, 24])
    g = 0.5 * h * (1.0 + tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
    return g + R
}
"""


def main() -> None:
    interpret.enable()
    from xgbuild.runtime.gpu import KernelExecutor
    graph = compile_source(SOURCE, "epilogue.xg").optimized.main
    kinds = [k.kind for k in schedule(graph).kernels]
    plans = generic_plans(graph, {})
    g = torch.Generator().manual_seed(0)
    x = {"X": torch.randn(2, 8, 16, generator=g), "W": torch.randn(16, 24, generator=g) / 4,
         "B": torch.randn(24, generator=g), "R": torch.randn(2, 8, 24, generator=g)}
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in x.items()}))
    ex = KernelExecutor(plans, interpret.launch, torch.device("cpu"))
    values = ex.run(sg, x)
    d = {k: v.double() for k, v in x.items()}
    h = (d["X"].reshape(16, 16) @ d["W"] + d["B"]).reshape(2, 8, 24)
    want = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h))) + d["R"]
    out = values[sg.output["t"]]
    print(json.dumps({"kinds": kinds, "shape": list(out.shape),
                      "rel_err": float((out.double() - want).norm() / want.norm())}))


if __name__ == "__main__":
    main()
