"""test_stack_partials.py's program through its kernels under Triton's interpreter (CPU), against
the float64 reference: the layers' partials placed into one [L, P, C] value and summed over P.
Prints the kernels' kinds and each output's error as JSON. A script, not a test: TRITON_INTERPRET
must be set before Triton is imported.

    python tests/unit/passes/interpret_stack_partials.py
"""

from __future__ import annotations

import json

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    from test_stack_partials import LAYERS, _inputs

    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_source
    g = compile_source(LAYERS, "layers.xg").optimized.main
    out = check_graph(g, [_inputs(0), _inputs(1)], {})
    print(json.dumps({"kinds": [k.kind for k in schedule(g).kernels], "errors": [r["rel_err"] for r in out]}))


if __name__ == "__main__":
    main()
