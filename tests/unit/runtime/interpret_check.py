"""Check mode's in-kernel NaN/Inf flags under Triton's interpreter (CPU): prints, as JSON, what the
generated kernels raise and what check mode reports. A script, not a test: TRITON_INTERPRET must be
set before Triton is imported, so the test runs it in a fresh process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from interpret_gather import generic_plans  # noqa: E402

from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402
from xgbuild.errors import ExecutionError  # noqa: E402
from xgbuild.runtime import interpret  # noqa: E402

# Line 4 makes the NaN (log of a negative); the output is a transpose of the kernel's result, so the
# kernel's flag guards it; `hidden` takes the NaN's other side of a `where` and is never seen.
SOURCE = """extern Tensor[float32, N, D] X
def main() {
    y = X * 2.0
    z = log(y) + 1.0
    hidden = where(X > 0.0, log(X), 0.0)
    return (transpose(z), hidden * 2.0)
}
"""


def main() -> None:
    interpret.enable()
    from xgbuild.runtime.gpu import KernelExecutor, check_outputs
    graph = compile_source(SOURCE, "check.xg").optimized.main
    dims = {"N": 3, "D": 8}
    plans = generic_plans(graph, dims)
    good = {"X": torch.rand(3, 8) + 0.5}
    bad = {"X": good["X"].clone()}
    bad["X"][1, 2] = -1.0
    sg = specialize(graph, bind_symbols(graph, {"X": (3, 8)}))
    report: dict = {}
    for label, replay in (("first", False), ("replayed", True)):
        ex = KernelExecutor(plans, interpret.launch, torch.device("cpu"), replay=replay)
        ex.check_outputs = True
        values = ex.run(sg, good)
        report[f"{label}_clean_flag"] = int(ex.flags.item())
        check_outputs(ex, sg, good, values, ex.flags)
        values = ex.run(sg, bad)
        report[f"{label}_flag"] = int(ex.flags.item())
        report["covered"] = len(ex.covered(sg))
        try:
            check_outputs(ex, sg, bad, values, ex.flags)
            report[label] = "no error"
        except ExecutionError as exc:
            report[label] = str(exc)
    ex.check_outputs = False
    ex.run(sg, bad)
    report["unchecked_flags"] = ex.flags
    print(json.dumps(report))


if __name__ == "__main__":
    main()
