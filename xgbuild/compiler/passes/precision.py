"""Mixed precision: the program's policy (`COMPUTE = bfloat16`, `Program.compute`) applied to its products.

What `torch.autocast(dtype=torch.bfloat16)` does on CUDA: every float32 product (a contraction:
`@`, so attention's `q @ k` and `p @ v` too) takes its operands rounded to the compute dtype and
gives its result in it, accumulating in float32 inside the kernel as XG's matmuls do; the result
is read back as float32 by its consumers, so reductions, softmax, normalisation, the loss and the
optimizer compute in float32, and inputs (parameters, optimizer state: the master weights) and
outputs keep their dtypes. Products written in another dtype (float64, or already 16-bit) are left
as written, as autocast leaves float64.

    c = a @ b      ->      c = cast(cast(a, bfloat16) @ cast(b, bfloat16), float32)

Each product gets casts of its own: their gradients come back as float32 before they are added up
(a weight read by two products sums two float32 gradients), and cse merges the forward copies.

Needs: lowered graphs, before autodiff, so the derivative of each cast (a cast back) puts the
backward products in the compute dtype too. Leaves: the same graphs with every float32 contraction
computing in `Program.compute`; the ids renumbered densely in each graph, the inputs, parameters
and output trees following. No policy (`compute` None): the program unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, GraphBuilder, Op, Program, tree_map
from ..ops import Kind, op_def

WRITTEN = "float32"     # the dtype of the products the policy changes


def precision(program: Program) -> Program:
    if program.compute is None or program.compute == WRITTEN:
        return program
    dtype = program.compute
    return replace(program, main=_apply(program.main, dtype),
                   functions={name: _apply(fn, dtype) for name, fn in program.functions.items()})


def _apply(graph: Graph, dtype: str) -> Graph:
    if not any(_applies(n) for n in graph.nodes):
        return graph
    b = GraphBuilder(graph.name)
    new: dict[int, int] = {}
    for n in graph.nodes:
        ins = [new[i] for i in n.inputs]
        if _applies(n):
            narrowed = [b.add(Op.CAST, (i,), dtype, b.node(i).shape, (), n.src) for i in ins]
            product = b.add(n.op, narrowed, dtype, n.shape, n.attrs, n.src)
            new[n.id] = b.add(Op.CAST, (product,), n.dtype, n.shape, (), n.src)
            continue
        new[n.id] = b.add(n.op, ins, n.dtype, n.shape, n.attrs, n.src)
    b.inputs = [(name, new[i]) for name, i in graph.inputs]
    b.params = [new[p] for p in graph.params]
    return b.build(tree_map(graph.output, new.__getitem__))


def _applies(n) -> bool:
    return op_def(n.op).kind is Kind.CONTRACT and n.dtype == WRITTEN


__all__ = ["precision"]
