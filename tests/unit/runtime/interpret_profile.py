"""The GPU executor's profiled launches under Triton's interpreter (CPU): prints, as JSON, the
profile of a matmul-plus-epilogue program run kernel by kernel through `KernelExecutor` with a
`Profiler` whose events read the host clock. A script, not a test: TRITON_INTERPRET must be set
before Triton is imported, so the test runs it in a fresh process."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from interpret_gather import generic_plans  # noqa: E402

from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402
from xgbuild.runtime import interpret  # noqa: E402
from xgbuild.runtime.profile import Profiler  # noqa: E402

SOURCE = """extern Tensor[float32, T, D] X
extern Tensor[float32, D, F] W
def main() {
    h = relu(X @ W)
    return softmax(h * 2.0, dim=1)
}
"""


class ClockEvent:
    """A stand-in for a timing CUDA event: the host clock when recorded (launches are synchronous
    under the interpreter)."""

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: "ClockEvent") -> float:
        return (end.at - self.at) * 1e3


def main() -> None:
    interpret.enable()
    from xgbuild.runtime.gpu import KernelExecutor
    graph = compile_source(SOURCE, "prof.xg").optimized.main
    dims = {"T": 16, "D": 32, "F": 24}
    plans = generic_plans(graph, dims)
    inputs = {"X": torch.randn(16, 32), "W": torch.randn(32, 24)}
    sg = specialize(graph, bind_symbols(graph, {"X": (16, 32), "W": (32, 24)}))
    ex = KernelExecutor(plans, interpret.launch, torch.device("cpu"), replay=True)
    ex.run(sg, inputs)                      # recorded for replay: a profiled run must not replay it
    prof = Profiler("cuda", event=ClockEvent, sync=lambda: None)
    results = []
    for _ in range(3):
        prof.begin()
        ex.profiler = prof
        out = ex.run(sg, inputs)
        ex.profiler = None
        prof.end()
        results.append(next(iter(out.values())))
    ref = torch.softmax(torch.relu(inputs["X"] @ inputs["W"]) * 2.0, dim=1)
    summary = prof.summary()
    print(json.dumps({"plans": [p.spec.name for p in plans], "summary": summary,
                      "trace": prof.chrome_trace(),
                      "error": max(float((r - ref).abs().max()) for r in results)}))


if __name__ == "__main__":
    main()
