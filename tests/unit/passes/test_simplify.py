"""`simplify`: exact identities of integer and boolean arithmetic, and a `where` on `a & b` split so
that its index-only half (a causal mask) sits outside, where the attention kernel computes it."""

from __future__ import annotations

import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

MASKED = """extern Tensor[float32, B, T, T] X
extern Tensor[bool, B, 1, T] PAD
def main() {
    pos = arange(T) + 0
    causal = reshape(pos, [T, 1]) >= reshape(pos * 1, [1, T])
    keep = (true and causal) and PAD
    return where(keep, X, -1e9)
}
"""


def _ops(compiled) -> list:
    return [n.op for n in compiled.optimized.main.nodes]


def test_identities_go_and_the_where_splits_with_the_causal_half_outside() -> None:
    before = compile_source(MASKED, stop_after="const-fold")
    after = compile_source(MASKED)
    g = after.optimized.main
    assert Op.ADD not in _ops(after) and Op.MUL not in _ops(after)      # + 0 and * 1 of integers
    wheres = [n for n in g.nodes if n.op is Op.WHERE]
    assert len(wheres) == 2
    outer = next(w for w in wheres if g.node(w.inputs[1]).op is Op.WHERE)
    inner = g.node(outer.inputs[1])
    # outside: the causal comparison of IOTAs; inside: the padding input, not an and of both
    assert g.node(outer.inputs[0]).op is Op.GE
    assert g.node(inner.inputs[0]).op in (Op.INPUT, Op.RESHAPE)
    assert not any(n.op is Op.AND for n in g.nodes)
    assert Op.AND in _ops(before)
    gen = torch.Generator().manual_seed(7)
    for b, t in ((2, 5), (3, 8)):
        x = torch.randn(b, t, t, generator=gen)
        pad = torch.rand(b, 1, t, generator=gen) > 0.3
        rows = torch.arange(t)[:, None]
        want = torch.where((rows >= torch.arange(t)[None, :]) & pad, x.double(), -1e9)
        inputs = {"X": x, "PAD": pad}
        sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
        got = CpuExecutor(float64=True, check=False).run(sg, inputs).values
        (value,) = [got[i] for i in got]
        assert torch.equal(value.double(), want)


def test_floats_keep_their_additions_of_zero() -> None:
    # -0.0 + 0.0 is +0.0: the identity does not hold for floats, so the op stays.
    c = compile_source("extern Tensor[float32, N] X\ndef main() {\n    return X + 0.0\n}\n")
    assert Op.ADD in _ops(c)


def test_where_of_two_data_masks_or_two_index_masks_is_left_alone() -> None:
    two_data = """extern Tensor[float32, T, T] X
extern Tensor[bool, T, T] A
extern Tensor[bool, 1, T] B
def main() {
    return where(A and B, X, 0.0)
}
"""
    two_index = """extern Tensor[float32, T, T] X
def main() {
    r = reshape(arange(T), [T, 1])
    c = reshape(arange(T), [1, T])
    return where((r >= c) and (r < c + 4), X, 0.0)
}
"""
    for src in (two_data, two_index):
        g = compile_source(src).optimized.main
        assert sum(n.op is Op.WHERE for n in g.nodes) == 1
        assert any(n.op is Op.AND for n in g.nodes)


def test_a_non_scalar_fill_is_not_split() -> None:
    src = """extern Tensor[float32, T, T] X
extern Tensor[float32, T, T] Y
extern Tensor[bool, 1, T] PAD
def main() {
    causal = reshape(arange(T), [T, 1]) >= reshape(arange(T), [1, T])
    return where(causal and PAD, X, Y)
}
"""
    g = compile_source(src).optimized.main
    assert sum(n.op is Op.WHERE for n in g.nodes) == 1


def test_a_cast_to_the_values_own_dtype_goes() -> None:
    """`cast(x, float32)` of a float32 `x` is `x` (no copy kernel); a cast to another dtype stays,
    and so does the output's value and dtype either way."""
    c = compile_source("extern Tensor[float32, N] X\ndef main() {\n    return cast(cast(X, float32) * 2.0, float32)\n}\n")
    assert Op.CAST not in _ops(c) and Op.MUL in _ops(c)
    c = compile_source("extern Tensor[float32, N] X\ndef main() {\n    return cast(X, bfloat16) * cast(1.5, bfloat16)\n}\n")
    assert _ops(c).count(Op.CAST) >= 1
    g = compile_source("extern Tensor[bfloat16, N] X\ndef main() {\n    return cast(X, bfloat16)\n}\n").optimized.main
    x = torch.randn(6).to(torch.bfloat16)
    sg = specialize(g, bind_symbols(g, {"X": (6,)}))
    (value,) = CpuExecutor(check=False).run(sg, {"X": x}).values.values()
    assert value.dtype == torch.bfloat16 and torch.equal(value, x)
