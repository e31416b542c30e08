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
    report = {"padded": any(n.op is Op.UNINDEX for n in g.nodes), "errors": [r["rel_err"] for r in out]}
    # Cross-entropy through a padded head: the one-hot's arange(V) and the padding's mask computed
    # from each element's column index in the loss's row kernel and the gradient's element-wise one.
    from test_pad_products import CROSS_ENTROPY

    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import template
    ce = compile_source(CROSS_ENTROPY, "ce.xg").optimized.main
    sched = schedule(ce)
    wide = [k for k in sched.kernels if k.kind in ("rowwise", "elementwise") and k.shape and k.shape[-1] >= 1031]
    report["ce_column_operands"] = sum(
        1 for k in wide for nid in template(k.kind).spec(sched, k)[1].operands
        if len(ce.node(nid).shape) == 2 and ce.node(nid).shape[0] == 1 and ce.node(nid).dtype in ("int64", "bool"))
    report["ce_kernels"] = [(k.kind, list(k.shape)) for k in wide]
    ce_values = {"X": torch.randn(64, 96, generator=gen), "W": torch.randn(1031, 96, generator=gen) * 0.3,
                 "Y": torch.randint(0, 1031, (64,), generator=gen)}
    report["ce_errors"] = [r["rel_err"] for r in check_graph(ce, ce_values, {})]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
