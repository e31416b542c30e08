"""passes/cast_views.py: casts move across views to the narrow side (attention's heads cast once
where the projection is made, a widened gradient placed from its narrow value, a cast round trip
through views gone), only where every view left reads through strides; values are bit for bit
those of the program before the pass."""

from __future__ import annotations

import pytest
import torch

from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, Program, tree_ids
from xgbuild.compiler.passes.autodiff import autodiff
from xgbuild.compiler.passes.cast_views import _strided, cast_views
from xgbuild.compiler.passes.inline import inline
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

SIZES = """B = 2
T = 8
H = 2
DH = 4
D = 8
D2 = 16
N = 16
"""

HEADS = SIZES + """extern Tensor[bfloat16, N, D] X
extern Tensor[bfloat16, D, D2] W
extern Tensor[float32, D2] BIAS
def main() {
    p = cast(X @ W, float32) + BIAS
    q = cast(transpose(reshape(p[:, 0:D], [B, T, H, DH]), dim0=1, dim1=2), bfloat16)
    k = cast(transpose(reshape(p[:, D:D2], [B, T, H, DH]), dim0=1, dim1=2), bfloat16)
    return q @ transpose(k, dim0=2, dim1=3)
}
"""

GRADS = SIZES + """extern Tensor[bfloat16, N, D] Y
extern Tensor[bfloat16, B, H, T, DH] A
extern Tensor[bfloat16, B, H, T, DH] G
extern Tensor[float32, B, T, H, DH] R
extern Tensor[bfloat16, D, D] WO
def main() {
    dO = cast(transpose(reshape(cast(Y, float32), [B, T, H, DH]), dim0=1, dim1=2), bfloat16)
    placed = transpose(cast(A, float32), dim0=1, dim1=2) + R
    merged = reshape(cast(transpose(cast(G, float32), dim0=1, dim1=2), bfloat16), [N, D]) @ WO
    return dO @ transpose(G, dim0=2, dim1=3), placed, merged
}
"""


def _inputs(g, gen: torch.Generator, sizes: dict) -> dict:
    out = {}
    for name, nid in g.inputs:
        n = g.node(nid)
        shape = tuple(sizes.get(d, d) for d in n.shape)
        out[name] = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2).to(getattr(torch, n.dtype))
    return out


def _run(g, inputs: dict) -> list:
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    out = CpuExecutor(check=False).run(sg, inputs).values
    return [out[i] for i in tree_ids(sg.output)]


def _bitwise_as_before(source: str, sizes: dict | None = None) -> None:
    compiled = compile_source(source)
    before = inline(autodiff(compiled.lowered)).main
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    inputs = _inputs(before, gen, sizes or {})
    for a, b in zip(_run(compiled.optimized.main, inputs), _run(before, inputs)):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _cast_through_view(g) -> list:
    """CAST nodes that read a view (a kernel of their own unless fused into their reader)."""
    return [n for n in g.nodes if n.op is Op.CAST and g.node(n.inputs[0]).op in (Op.TRANSPOSE, Op.RESHAPE, Op.INDEX)]


def test_heads_of_a_projection_are_cast_once_in_its_epilogue() -> None:
    g = compile_source(HEADS).optimized.main
    assert not _cast_through_view(g)
    narrow = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "bfloat16"]
    assert len(narrow) == 1 and g.node(narrow[0].inputs[0]).op is Op.ADD
    # The projection's kernel writes the bfloat16 value only; q and kT are views of it.
    sched = schedule(g)
    proj = next(k for k in sched.kernels if k.kind == "matmul" and tuple(k.shape) == (16, 16))
    assert [g.node(n).dtype for n in sched.outputs(proj)] == ["bfloat16"]
    _bitwise_as_before(HEADS)


def test_round_trips_vanish_and_widened_values_are_read_narrow() -> None:
    g = compile_source(GRADS).optimized.main
    users = g.users()
    # dO: the bfloat16 product operand is a view of Y itself.
    scores = next(n for n in g.nodes if n.op is Op.MATMUL and tuple(n.shape) == (2, 2, 8, 8))
    first = g.node(scores.inputs[0])
    while first.op in (Op.TRANSPOSE, Op.RESHAPE):
        first = g.node(first.inputs[0])
    assert first.op is Op.INPUT and first.attr("name") == "Y"
    # placed: the add reads a widening cast of the transposed bfloat16 A, in its own kernel.
    add = next(n for n in g.nodes if n.op is Op.ADD and n.dtype == "float32")
    widen = next(g.node(i) for i in add.inputs if g.node(i).op is Op.CAST)
    assert g.node(widen.inputs[0]).op is Op.TRANSPOSE and g.node(widen.inputs[0]).dtype == "bfloat16"
    sched = schedule(g)
    assert not any(g.node(n).op is Op.CAST and g.node(n).dtype == "float32"
                   for k in sched.kernels for n in sched.outputs(k))
    # merged: reshape(transpose(G)) is no view, so the bfloat16 copy stays a kernel (it would
    # otherwise be a copy by the runtime): its cast reads the widened transpose in registers.
    merged = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "bfloat16"]
    assert len(merged) == 1 and all(g.node(u).op is Op.RESHAPE for u in users[merged[0].id])
    _bitwise_as_before(GRADS)


def test_symbolic_shapes_keep_reshapes_they_cannot_prove_views() -> None:
    src = """extern Tensor[bfloat16, M, K] Y
extern Tensor[bfloat16, K, M] W
def main() {
    a = cast(reshape(transpose(cast(Y, float32), dim0=0, dim1=1), [K, M, 1]), bfloat16)
    b = cast(transpose(cast(Y, float32), dim0=0, dim1=1), bfloat16)
    return a, b @ Y
}
"""
    g = compile_source(src).optimized.main
    # The transpose is a view at any size: its round trip goes. The reshape (sunk below the cast)
    # of a transposed value is unproved at symbolic sizes: that cast stays, reading the widened
    # transpose in registers.
    casts = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "bfloat16"]
    assert len(casts) == 1 and [g.node(u).op for u in g.users()[casts[0].id]] == [Op.RESHAPE]
    widened = g.node(casts[0].inputs[0])
    assert widened.op is Op.CAST and g.node(widened.inputs[0]).op is Op.TRANSPOSE
    _bitwise_as_before(src, {"M": 5, "K": 3})


def test_outputs_keep_their_node_and_dtype() -> None:
    src = SIZES + """extern Tensor[bfloat16, B, H, T, DH] A
def main() {
    w = cast(A, float32)
    t = transpose(w, dim0=1, dim1=2)
    return cast(t, bfloat16), t
}
"""
    compiled = compile_source(src)
    g = compiled.optimized.main
    outs = [g.node(i) for i in tree_ids(g.output)]
    assert [n.dtype for n in outs] == ["bfloat16", "float32"]
    _bitwise_as_before(src)


def test_a_program_without_casts_is_unchanged() -> None:
    src = SIZES + """extern Tensor[float32, N, D] X
def main() {
    return transpose(reshape(X, [B, T, H, DH]), dim0=1, dim1=2) * 2.0
}
"""
    lowered = inline(autodiff(compile_source(src).lowered))
    assert cast_views(lowered).main.nodes == lowered.main.nodes


@pytest.mark.parametrize("shape,chain,ok", [
    ((4, 6), [("T", (6, 4), (0, 1)), ("R", (24,))], False),          # a transposed value flattened
    ((4, 6), [("I", (4, 3), ((None, None, None), (0, 3, None))), ("R", (4, 3, 1))], True),
    ((4, 6), [("I", (4, 3), ((None, None, None), (0, 3, None))), ("R", (12,))], False),   # rows apart
    ((4, 6), [("I", (4, 3), ((None, None, None), (0, 6, 2))), ("R", (12,))], True),    # every other one
    ((2, 3, 4), [("T", (3, 2, 4), (0, 1)), ("R", (3, 8))], False),      # dims 1 and 2 no longer adjacent
    ((2, 3, 4), [("T", (3, 2, 4), (0, 1)), ("R", (3, 2, 2, 2))], True),  # the last dim split
])
def test_strided_follows_torch_view_rules(shape, chain, ok) -> None:
    from xgbuild.compiler.ir.graph import Node, attrs_of
    nodes = []
    for k, step in enumerate(chain):
        if step[0] == "T":
            nodes.append(Node(k, Op.TRANSPOSE, (k - 1,), "float32", step[1], attrs_of(dim0=step[2][0], dim1=step[2][1])))
        elif step[0] == "R":
            nodes.append(Node(k, Op.RESHAPE, (k - 1,), "float32", step[1], ()))
        else:
            nodes.append(Node(k, Op.INDEX, (k - 1,), "float32", step[1],
                              attrs_of(items=tuple(("s",) + s for s in step[2]))))
    assert _strided(shape, nodes) is ok
    # torch agrees: the same views of a contiguous tensor, `view` failing where a copy is needed.
    t = torch.empty(shape)
    try:
        for step in chain:
            if step[0] == "T":
                t = t.transpose(*step[2])
            elif step[0] == "R":
                t = t.view(step[1])
            else:
                t = t[tuple(slice(*s) for s in step[2])]
        assert ok
    except RuntimeError:
        assert not ok


STACKED = """L = 3
extern Tensor[bfloat16, 8, 4] X
extern Tensor[float32, L, 4, 4] W
def main() {
    x = X
    for l in range(L) {
        x = x @ cast(W[l], bfloat16)
    }
    return x, W * 0.5
}
"""


def test_a_stacked_weight_is_cast_once_for_all_its_slices() -> None:
    g = compile_source(STACKED).optimized.main
    casts = [n for n in g.nodes if n.op is Op.CAST and n.dtype == "bfloat16"]
    # One cast of the whole [L, 4, 4] weight; each layer's product reads its slice of it, and the
    # other reader (the scaled weight) reads the float32 value.
    assert len(casts) == 1 and tuple(casts[0].shape) == (3, 4, 4)
    assert g.node(casts[0].inputs[0]).op is Op.INPUT
    users = g.users()
    assert {g.node(u).op for u in users[casts[0].id]} == {Op.INDEX}
    sched = schedule(g)
    assert sum(1 for k in sched.kernels if all(g.node(n).op is Op.CAST for n in k.nodes)) == 1
    _bitwise_as_before(STACKED)


@pytest.mark.parametrize("body", [
    "x = x @ cast(W[l], bfloat16)",                                   # l < L - 1: slices left out
    "x = cast(cast(x, float32) @ W[l], bfloat16)",                    # a slice read wide
])
def test_slices_cast_apart_where_the_whole_cast_would_do_more(body: str) -> None:
    src = STACKED.replace("x = x @ cast(W[l], bfloat16)", body).replace("range(L)", "range(L - 1)" if "@ cast(W" in body else "range(L)")
    g = compile_source(src).optimized.main
    assert not any(n.op is Op.CAST and n.dtype == "bfloat16" and tuple(n.shape) == (3, 4, 4) for n in g.nodes)
    _bitwise_as_before(src)
