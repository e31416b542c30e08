"""Runs `gather` graphs' GPU kernels under Triton's interpreter (CPU) and prints, as JSON, each
output's relative error against the float64 CPU reference (`build.interpreted.check_graph`). A script, not
a test: TRITON_INTERPRET must be set before Triton is imported, so the test runs it in a fresh
process.

    python tests/unit/codegen/interpret_gather.py CASE          # one of CASES
    python tests/unit/codegen/interpret_gather.py out_of_range  # kernel outputs for a bad index
"""

from __future__ import annotations

import json
import sys

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.ir.graph import Graph, GraphBuilder, Node, Op, attrs_of
from xgbuild.compiler.ir.shapes import infer
from xgbuild.compiler.ir.verify import verify
from xgbuild.runtime import interpret

TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64, "int32": torch.int32,
         "int64": torch.int64}


class Builder:
    """Inputs by (dtype, shape) with symbolic dims, the other nodes' types from the IR's rules."""

    def __init__(self) -> None:
        self.b = GraphBuilder("main")
        self.sig: dict[str, tuple[str, tuple]] = {}

    def input(self, dtype: str, shape: tuple) -> int:
        name = f"x{len(self.sig)}"
        nid = self.b.add(Op.INPUT, (), dtype, shape, attrs_of(name=name))
        self.b.inputs.append((name, nid))
        self.sig[name] = (dtype, shape)
        return nid

    def op(self, op: Op, *inputs: int, dtype: str = "", **attrs) -> int:
        probe = Node(-1, op, inputs, dtype, (), attrs_of(**attrs))
        dt, shape = infer(probe, [(self.b.node(i).dtype, self.b.node(i).shape) for i in inputs])
        return self.b.add(op, inputs, dt, shape, attrs_of(**attrs))

    def const(self, value, dtype: str) -> int:
        return self.b.add(Op.CONST, (), dtype, (), attrs_of(value=value))

    def graph(self, *outs: int) -> Graph:
        g = self.b.build({"tuple": [{"t": o} for o in outs]})
        verify(g)
        return g


def case(name: str) -> tuple[Graph, dict[str, tuple[str, tuple]], int]:
    """A graph, its signature and the table rows its index inputs must stay under."""
    g = Builder()
    if name == "embed_add":
        # GPT-style: token rows plus position rows, fused into the gather's kernel; bf16 table.
        tok = g.op(Op.GATHER, g.input("bfloat16", (50, 24)), g.input("int64", ("B", "T")))
        out = g.op(Op.ADD, g.op(Op.CAST, tok, dtype="float32"), g.input("float32", ("T", 24)))
        return g.graph(out), g.sig, 50
    if name == "shapes":
        # 3-D indices, a 3-D table (two dims after the rows), int32 indices, a 1-D table.
        a = g.op(Op.GATHER, g.input("float32", (40, 6)), g.input("int32", ("B", 3, "T")))
        b = g.op(Op.GATHER, g.input("float32", (40, 3, 5)), g.input("int64", ("T",)))
        c = g.op(Op.GATHER, g.input("bfloat16", (40,)), g.input("int64", ("T", "B")))
        return g.graph(a, b, c), g.sig, 40
    if name == "strided":
        # The table is a transposed view (read through its strides); the indices come from
        # another kernel (`idx + 1`), then a consumer joins the gather's kernel.
        w = g.input("float32", (16, 41))
        idx = g.op(Op.ADD, g.input("int64", ("B", "T")), g.const(1, "int64"))
        rows = g.op(Op.GATHER, g.op(Op.TRANSPOSE, w, dim0=0, dim1=1), idx)
        return g.graph(g.op(Op.MUL, rows, g.const(2.0, "float32"))), g.sig, 40
    raise SystemExit(f"unknown case {name!r}")


CASES = ("embed_add", "shapes", "strided")


def inputs(sig: dict, dims: dict[str, int], rows: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, (dtype, shape) in sig.items():
        shape = tuple(dims[d] if isinstance(d, str) else d for d in shape)
        if dtype.startswith("int"):
            out[name] = torch.randint(0, rows, shape, generator=gen).to(TORCH[dtype])
        else:
            out[name] = torch.randn(shape, generator=gen).to(TORCH[dtype])
    return out


def generic_plans(graph: Graph, dims: dict[str, int]) -> list:
    """The graph's launches, each with only its generic variant (interpreted)."""
    from xgbuild.compiler.codegen.build import load_function
    from xgbuild.compiler.codegen.launch_abi import Compiled, KernelPlan, Variant
    from xgbuild.compiler.codegen.templates import emit
    from xgbuild.tuner.jobs import plan, tuning_env
    from xgbuild.tuner.space import default_config

    jobs, launches = plan(graph, tuning_env(graph, dims))
    compiled = {}
    for job in jobs:
        em = emit(job.spec, default_config(job.problem), Variant.generic())
        compiled[job.ident] = (job.spec, Compiled(Variant.generic(), default_config(job.problem), em.params,
                                                  em.div16, (load_function(em), em)))
    return [KernelPlan(compiled[ident][0], b, [compiled[ident][1]]) for ident, b in launches]


def out_of_range() -> dict:
    """The gather kernel's output where an index is outside the table: masked, so zeros."""
    from xgbuild.compiler.passes.specialize import bind_symbols, specialize
    from xgbuild.runtime.gpu import KernelExecutor

    g = Builder()
    graph = g.graph(g.op(Op.GATHER, g.input("float32", (8, 5)), g.input("int64", ("T",))))
    table = torch.randn(8, 5)
    idx = torch.tensor([7, 8, -1, 100000, 0, -8])
    values = {"x0": table, "x1": idx}
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in values.items()}))
    plans = generic_plans(graph, {"T": 6})
    got = KernelExecutor(plans, interpret.launch, torch.device("cpu")).run(sg, values)
    y = next(iter(got.values()))
    want = torch.zeros(6, 5)
    want[0], want[4] = table[7], table[0]
    return {"equal": bool(torch.equal(y, want))}


def computed_out_of_range() -> dict:
    """Indices the program computes (`idx + 1`) run past the table: check mode says so after the
    run, replayed or not; without check mode the lookup reads zeros."""
    from xgbuild.compiler.passes.specialize import bind_symbols, specialize
    from xgbuild.errors import ExecutionError
    from xgbuild.runtime.gpu import KernelExecutor

    graph, _sig, _rows = case("strided")                 # table: 41 rows (a transposed [16, 41])
    good = {"x0": torch.randn(16, 41), "x1": torch.tensor([[0, 39, 5]])}
    bad = {"x0": good["x0"], "x1": torch.tensor([[0, 40, 5]])}             # 40 + 1 = 41: past the end
    plans = generic_plans(graph, {"B": 1, "T": 3})
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in good.items()}))
    report = {}
    for label, replay in (("first", False), ("replayed", True)):
        ex = KernelExecutor(plans, interpret.launch, torch.device("cpu"), replay=replay)
        ex.check_indices = True
        ex.run(sg, good)                                # in range: no error (and recorded, if replaying)
        try:
            ex.run(sg, bad)
            report[label] = "no error"
        except ExecutionError as exc:
            report[label] = str(exc)
    ex.check_indices = False
    report["unchecked"] = "ran" if ex.run(sg, bad) else "?"
    return report


def main() -> None:
    interpret.enable()
    name = sys.argv[1]
    if name == "out_of_range":
        print(json.dumps(out_of_range()))
        return
    if name == "computed_out_of_range":
        print(json.dumps(computed_out_of_range()))
        return
    graph, sig, rows = case(name)
    # Tuned at one size, run at two others (the second input set replayed).
    runs = [inputs(sig, {"B": 3, "T": 7}, rows, 1), inputs(sig, {"B": 3, "T": 7}, rows, 2),
            inputs(sig, {"B": 2, "T": 33}, rows, 3)]
    print(json.dumps(check_graph(graph, runs, {"B": 2, "T": 16})))


if __name__ == "__main__":
    main()
