"""Runs one example model's GPU kernels under Triton's interpreter (CPU) and prints, as JSON, each
output's relative error against the float64 CPU reference. A script, not a test: TRITON_INTERPRET
must be set before Triton is imported, so the test runs it in a fresh process.

    python tests/unit/importers/interpret_model.py gpt [--onnx FILE]
"""

from __future__ import annotations

import json
import sys

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    import zoo  # noqa: F401  (puts examples/ on the path)
    from xgbuild.compiler.importers.onnx_import import import_onnx
    from xgbuild.compiler.importers.torch_export import import_torch
    name = sys.argv[1]
    model, inputs, dyn = zoo.make(name)
    if len(sys.argv) > 3 and sys.argv[2] == "--onnx":
        imported = import_onnx(sys.argv[3])
    else:
        imported = import_torch(model, inputs, dynamic_shapes=dyn)
    fresh = zoo.fresh_inputs(name, batch=3)                 # tuned at batch 2, run at 3: generic paths too
    values = dict(zip(imported.inputs, fresh))
    values.update(imported.weights)
    dims = {s: 2 for s in imported.optimized.main.symbols() if s.isidentifier()}
    report = check_graph(imported.optimized.main, values, dims)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
