"""Runs the GPU kernels of every case in indexing_cases.py under Triton's interpreter (CPU) and
prints, as JSON, each output's relative error against the float64 CPU reference. A script, not a
test: TRITON_INTERPRET must be set before Triton is imported, so the test runs it in a fresh process.
"""

from __future__ import annotations

import json

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    from indexing_cases import CASES, fresh
    from xgbuild.compiler.importers.torch_export import import_torch
    report = {}
    for name, (fn, inputs) in CASES.items():
        imported = import_torch(fn, inputs)
        values = dict(zip(imported.inputs, fresh(inputs)))
        values.update(imported.weights)
        report[name] = check_graph(imported.optimized.main, values, {})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
