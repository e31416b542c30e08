"""The padded products of passes/pad_products.py run as Triton kernels under the interpreter (CPU)
against the float64 reference: the odd-pitch test program of test_pad_products.py with the
pass's thresholds lowered so that it pads. Prints, as JSON, whether the graph was padded and each
output's error. A script, not a test: TRITON_INTERPRET must be set before Triton is imported.

    python tests/unit/passes/interpret_padded.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.ir.graph import Op
from xgbuild.compiler.passes import pad_products as pp
from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    from test_pad_products import HEAD

    from xgbuild.compiler.driver import compile_source
    pp.MIN_FLOPS, pp.MIN_DIM = 0, 256
    g = compile_source(HEAD, "head.xg").optimized.main
    gen = torch.Generator().manual_seed(3)
    values = {"X": torch.randn(64, 96, generator=gen), "W": torch.randn(1031, 96, generator=gen) * 0.1,
              "G": torch.randn(64, 1031, generator=gen)}
    out = check_graph(g, values, {})
    print(json.dumps({"padded": any(n.op is Op.UNINDEX for n in g.nodes), "errors": [r["rel_err"] for r in out]}))


if __name__ == "__main__":
    main()
