"""Runs `scatter_add` graphs' GPU kernels under Triton's interpreter (CPU) and prints, as JSON,
each output's relative error against the float64 CPU reference (`build.interpreted.check_graph`).
A script, not a test: TRITON_INTERPRET must be set before Triton is imported, so the test runs it
in a fresh process.

    python tests/unit/codegen/interpret_scatter.py CASE          # one of CASES
    python tests/unit/codegen/interpret_scatter.py out_of_range  # indices past the table, repeated runs
"""

from __future__ import annotations

import json
import sys

import torch

from interpret_gather import Builder, generic_plans, inputs
from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.ir.graph import Graph, Op
from xgbuild.runtime import interpret

def case(name: str) -> tuple[Graph, dict[str, tuple[str, tuple]], int]:
    """A graph, its signature and the table rows its indices spread over."""
    g = Builder()
    if name == "embed_grad":
        # GPT-style: bf16 rows of a token embedding's gradient, a float32 consumer (the tied head's
        # gradient added to it) in a kernel of its own.
        rows = g.op(Op.SCATTER_ADD, g.input("int64", ("T",)), g.input("bfloat16", ("T", 24)), rows=50)
        out = g.op(Op.ADD, g.op(Op.CAST, rows, dtype="float32"), g.input("float32", (50, 24)))
        return g.graph(out), g.sig, 50
    if name == "strided":
        # float32 rows read through a transpose's strides, int32 indices, a table of 37 rows
        # (no multiple of any block), columns fewer than a block.
        src = g.op(Op.TRANSPOSE, g.input("float32", (40, "T")), dim0=0, dim1=1)
        return g.graph(g.op(Op.SCATTER_ADD, g.input("int32", ("T",)), src, rows=37)), g.sig, 37
    if name == "float64":
        return g.graph(g.op(Op.SCATTER_ADD, g.input("int64", ("T",)), g.input("float64", ("T", 8)), rows=13)), \
            g.sig, 13
    raise SystemExit(f"unknown case {name!r}")


CASES = ("embed_grad", "strided", "float64")


def out_of_range() -> dict:
    """Indices before the table, past it and past int32 add nothing; repeated indices sum; two runs
    give the same bits."""
    from xgbuild.compiler.passes.specialize import bind_symbols, specialize
    from xgbuild.runtime.gpu import KernelExecutor

    g = Builder()
    graph = g.graph(g.op(Op.SCATTER_ADD, g.input("int64", ("T",)), g.input("float32", ("T", 5)), rows=9))
    idx = torch.tensor([8, 9, -1, 2**33 + 3, 0, -8, 3, 3, 3, 8])
    src = torch.randn(10, 5, generator=torch.Generator().manual_seed(4))
    values = {"x0": idx, "x1": src}
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in values.items()}))
    plans = generic_plans(graph, {"T": 10})
    runs = []
    for _ in range(2):
        got = KernelExecutor(plans, interpret.launch, torch.device("cpu")).run(sg, values)
        runs.append(next(iter(got.values())))
    want = torch.zeros(9, 5, dtype=torch.float64)
    for i, r in enumerate(idx.tolist()):
        if 0 <= r < 9:
            want[r] += src[i].double()
    err = ((runs[0].double() - want).norm() / want.norm()).item()
    return {"rel_err": err, "same_bits": bool(torch.equal(runs[0], runs[1])),
            "untouched_zero": bool((runs[0][[1, 2, 4, 5, 6, 7]] == 0).all())}


def main() -> None:
    interpret.enable()
    name = sys.argv[1]
    if name == "out_of_range":
        print(json.dumps(out_of_range()))
        return
    graph, sig, rows = case(name)
    # Tuned at one size, run at others: token counts that are no multiple of any block.
    runs = [inputs(sig, {"T": 7}, rows, 1), inputs(sig, {"T": 7}, rows, 2), inputs(sig, {"T": 133}, rows, 3)]
    print(json.dumps(check_graph(graph, runs, {"T": 64})))


if __name__ == "__main__":
    main()
