"""Runs one XG program's kernels under Triton's interpreter (CPU): tuned (predicted) at one set of
dims, run at each of several others, compared with the float64 CPU reference. Prints, as JSON,
the kernel kinds of the schedule and one report per run. A script, not a test: TRITON_INTERPRET
must be set before Triton is imported, so the tests run it in a fresh process.

    python tests/unit/codegen/interpret_attention.py FILE.xg '{"T": 32}' '[{"T": 32}, {"T": 37}]'
"""

from __future__ import annotations

import json
import sys

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    from xgbuild.build.package import engine_of
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_file
    from xgbuild.runtime.tensor_io import random_inputs

    path, tune, runs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    compiled = compile_file(path)
    graph = compiled.optimized.main
    engine = engine_of(compiled)
    reports = []
    for seed, dims in enumerate(runs):
        sig = {s["name"]: (s["dtype"], tuple(dims[d] if isinstance(d, str) else d for d in s["shape"]))
               for s in engine.signature}
        reports.append({"dims": dims, "outputs": check_graph(graph, random_inputs(sig, seed), tune)})
    print(json.dumps({"kinds": [k.kind for k in schedule(graph).kernels], "runs": reports}))


if __name__ == "__main__":
    main()
