"""Check mode's range check of computed GATHER indices under Triton's interpreter (CPU): indices that
follow from the graph's shapes alone (a convolution's im2col) are checked by the first run and never
again; indices computed from an input are checked every run, replayed or not. Prints, as JSON, the
index reductions each run made and the errors raised. A script, not a test: TRITON_INTERPRET must
be set before Triton is imported, so the test runs it in a fresh process."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from interpret_gather import generic_plans  # noqa: E402

from xgbuild.compiler.importers.torch_export import import_torch  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402
from xgbuild.errors import ExecutionError  # noqa: E402
from xgbuild.runtime import interpret  # noqa: E402


def main() -> None:
    interpret.enable()
    from xgbuild.runtime import gpu
    from xgbuild.runtime.gpu import KernelExecutor
    counted = [0]
    aminmax = torch.aminmax

    def counting(*a, **k):
        counted[0] += 1
        return aminmax(*a, **k)
    torch.aminmax = counting
    report: dict = {}
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    cases = {"conv": (conv, (torch.randn(2, 3, 6, 5),), [(torch.randn(2, 3, 6, 5),)] * 3),
             "lookup": (lambda e, i: e[9 - i * 2] * 2.0, (torch.randn(10, 4), torch.arange(5)),
                        [(torch.randn(10, 4), torch.arange(5)), (torch.randn(10, 4), torch.arange(5) - 1),
                         (torch.randn(10, 4), torch.arange(5))])}
    for name, (fn, example, runs) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported = import_torch(fn, example)
        graph = imported.optimized.main
        plans = generic_plans(graph, {})
        ex = KernelExecutor(plans, interpret.launch, torch.device("cpu"), replay=True)
        ex.check_indices = True
        rows = []
        specialized: dict = {}          # one graph per input shapes, as an engine keeps them
        for args in runs:
            values = dict(zip(imported.inputs, args)) | dict(imported.weights)
            shapes = {k: tuple(v.shape) for k, v in values.items()}
            key = tuple(sorted(shapes.items()))
            sg = specialized.setdefault(key, specialize(graph, bind_symbols(graph, shapes)))
            counted[0] = 0
            try:
                ex.run(sg, values)
                rows.append({"checked": counted[0]})
            except ExecutionError as exc:
                rows.append({"checked": counted[0], "error": str(exc)})
        report[name] = rows
    report["gpu_module_aminmax_patched"] = gpu.torch.aminmax is counting
    print(json.dumps(report))


if __name__ == "__main__":
    main()
