"""The split products of passes/split_products.py run as Triton kernels under the interpreter (CPU)
against the float64 reference: split_products_cases.py's program on a GPU of 4 SMs, where each of
the pass's forms is taken. Prints, as JSON, the widened products made and each output's error.
A script, not a test: TRITON_INTERPRET must be set before Triton is imported.

    python tests/unit/passes/interpret_split_products.py
"""

from __future__ import annotations

import json

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes import split_products as sp
from xgbuild.runtime import interpret


def report(device: str = "cpu") -> dict:
    """The widened products made and each output's error, the kernels interpreted ("cpu") or
    compiled for the local GPU ("cuda": tests/gpu/test_split_products_cuda.py)."""
    import split_products_cases as cases
    sp.LAUNCH_S = 0.0
    g = cases.optimized()
    got = check_graph(g, cases.inputs(5), {}, device=device)
    errors = {r["node"]: r["rel_err"] for r in got}
    return {"widened": sum(bool(n.op is Op.MATMUL and n.attr("widened")) for n in g.nodes),
            "errors": [errors[i] for i in tree_ids(g.output)]}


def main() -> None:
    interpret.enable()
    print(json.dumps(report()))


if __name__ == "__main__":
    main()
