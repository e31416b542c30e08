"""passes/pad_products.py: a large product with an odd row pitch (K or N not a whole number of 16
bytes) reads zero-padded operands and writes a padded output that its readers see through a view;
values are unchanged bit for bit; small products and aligned ones are left alone; GPT-2's tied LM
head (50257 words) pads its three products and nothing else."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.constants import normalize
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes import pad_products as pp
from xgbuild.runtime.cpu import CpuExecutor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402

# An odd N (the LM head's logits), an odd K (its input gradient) and the weight's gradient
# through autodiff, under a bfloat16 product policy; the loss reads the logits' view.
HEAD = """extern Tensor[float32, 64, 96] X
extern Tensor[float32, 1031, 96] W
extern Tensor[float32, 64, 1031] G
def f(Tensor[float32, 64, 96] x, Tensor[float32, 1031, 96] w, Tensor[float32, 64, 1031] g) -> float32 {
    logits = cast(cast(x, bfloat16) @ transpose(cast(w, bfloat16), 0, 1), float32)
    return sum(exp(logits * 0.1) * g)
}
def main() {
    return (grad(f, wrt=(x, w))(X, W, G), cast(cast(X, bfloat16) @ transpose(cast(W, bfloat16), 0, 1), float32),
            cast(transpose(cast(X, bfloat16), 0, 1) @ cast(G, bfloat16), float32))
}
"""

# GPT-2's loss and its gradients through a tied head of an odd vocabulary (1031 words).
CROSS_ENTROPY = """import std.nn
COMPUTE = bfloat16
extern Tensor[float32, 64, 96] X
extern Tensor[float32, 1031, 96] W
extern Tensor[int64, 64] Y
def f(Tensor[float32, 64, 96] x, Tensor[float32, 1031, 96] w, Tensor[int64, 64] y) -> float32 {
    return cross_entropy(x @ transpose(w), y)
}
def main() {
    return grad(f, wrt=(x, w))(X, W, Y)
}
"""


def _products(g) -> list[tuple]:
    """(M, K, N) of each 2-D product."""
    return sorted(tuple(g.node(n.inputs[0]).shape) + tuple(n.shape[-1:]) for n in g.nodes
                  if n.op is Op.MATMUL and len(n.shape) == 2)


def _run(g, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    inputs = {"X": torch.randn(64, 96, generator=gen), "W": torch.randn(1031, 96, generator=gen) * 0.1,
              "G": torch.randn(64, 1031, generator=gen)}
    out = CpuExecutor(check=False).run(g, inputs).values
    return [out[i] for i in tree_ids(g.output)]


@pytest.fixture
def eager_padding(monkeypatch):
    monkeypatch.setattr(pp, "MIN_FLOPS", 0)
    monkeypatch.setattr(pp, "MIN_DIM", 256)


def test_odd_dims_are_padded_and_values_unchanged(eager_padding, monkeypatch) -> None:
    g = compile_source(HEAD).optimized.main
    # Every product with 1031 (2062 bytes of bfloat16 a row) as its N or K runs at 1088 (a
    # multiple of 64 elements, 128 bytes); 1031 as M (the weight's gradient) is no row pitch.
    shapes = _products(g)
    assert (64, 96, 1088) in shapes and (64, 1088, 96) in shapes and (96, 64, 1088) in shapes
    # The last product, read by one cast alone, is cast padded (in its epilogue) and viewed after.
    views = [n for n in g.nodes if n.op is Op.INDEX and tuple(n.shape) == (96, 1031) and n.dtype == "float32"]
    assert len(views) == 1 and g.node(views[0].inputs[0]).op is Op.CAST
    assert all(1031 not in s[1:] for s in shapes), shapes
    assert any(n.op is Op.UNINDEX for n in g.nodes) and any(n.op is Op.INDEX and n.shape[-1] == 1031 for n in g.nodes)
    monkeypatch.setattr(pp, "MIN_FLOPS", math.inf)
    plain = compile_source(HEAD).optimized.main
    assert not any(n.op is Op.UNINDEX for n in plain.nodes)
    for got, want in zip(_run(g), _run(plain)):
        assert got.shape == want.shape
        assert torch.equal(got, want)           # zeros added to the sums: the same bits


def test_small_or_aligned_products_keep_their_shapes() -> None:
    g = compile_source(HEAD).optimized.main     # 2 x 64 x 96 x 1031 flops: below MIN_FLOPS
    assert not any(n.op is Op.UNINDEX for n in g.nodes)
    assert pp._padded(50257, 2) == 50304 and pp._padded(50257, 4) == 50272
    assert not pp._odd(768, 2) and pp._odd(50257, 2) and not pp._odd(1000, 2)   # 2000 bytes: aligned


def test_gpt2_pads_its_lm_head_products_only() -> None:
    c = compile_file("models/train.xg", CheckOptions(consts=normalize({"L": 1})))
    g = c.optimized.main
    padded = [s for s in _products(g) if 50304 in s]
    assert len(padded) == 3 and not any(50257 in s for s in _products(g))
    # The logits' gradient is computed padded, once, for both products that read it: one kernel
    # masks its expression past the 50257 words, none copies it into a padded buffer.
    users = g.users()
    grads = [n for n in g.nodes if tuple(n.shape) == (8192, 50304) and n.op is not Op.MATMUL
             and any(g.node(u).op is Op.MATMUL for u in users[n.id])]
    assert len(grads) == 1 and grads[0].op is Op.WHERE and len(users[grads[0].id]) == 2
    assert not any(n.op is Op.UNINDEX and tuple(n.shape) == (8192, 50304) for n in g.nodes)
    kernels = schedule(g)
    writers = [k for k in kernels.kernels if grads[0].id in kernels.outputs(k)]
    assert len(writers) == 1 and writers[0].kind == "elementwise"
    written = [tuple(g.node(o).shape) for k in kernels.kernels for o in kernels.outputs(k)]
    assert (8192, 50257) not in written                 # no unpadded [tokens, vocabulary] value


def test_padded_kernels_match_float64_under_the_interpreter() -> None:
    report = interpreted_report(HERE / "interpret_padded.py")
    assert report["padded"] and all(err < 2e-2 for err in report["errors"]), report
    # Cross-entropy's kernels over the padded logits read no [1, V] arange or mask: they compute
    # them from the column index (8 + 1 bytes a logit read from cache, for a 2-byte logit).
    kinds = sorted(kind for kind, _ in report["ce_kernels"])
    assert kinds.count("rowwise") >= 1 and kinds.count("elementwise") >= 1, report["ce_kernels"]
    assert report["ce_column_operands"] == 0, report
    assert report["ce_errors"] and all(err < 2e-2 for err in report["ce_errors"]), report
