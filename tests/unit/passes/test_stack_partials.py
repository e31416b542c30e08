"""passes/stack_partials.py: a stacked parameter's gradient, a sum of per-layer placements of split
reductions' second stages, sums every layer's partials in one reduction; the values are float64's
(CPU executor) and the kernels', under Triton's interpreter (`interpret_stack_partials.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402

# Three layers reading a stacked bias a row each: its gradient over 1024 tokens is split in two
# stages per layer (split-reductions), then placed in row l of the [3, 16] gradient.
LAYERS = """L = 3
T = 1024
C = 16
extern Tensor[float32, T, C] X
extern Tensor[float32, L, C] B
extern Tensor[float32, C] D
def f(Tensor[float32, L, C] b, Tensor[float32, C] d, Tensor[float32, T, C] x) -> float32 {
    h = x
    for l in range(L) {
        h = tanh(h + b[l])
    }
    return sum(h * h) + sum(tanh(x + d))
}
def main() {
    return grad(f, wrt=(b, d))(B, D, X)
}
"""


def _run(g, inputs: dict) -> list[torch.Tensor]:
    sg = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
    out = CpuExecutor(float64=True, check=False).run(sg, inputs).values
    return [out[i] for i in tree_ids(sg.output)]


def _inputs(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"X": torch.randn(1024, 16, generator=gen, dtype=torch.float64).float(),
            "B": (torch.randn(3, 16, generator=gen) * 0.5), "D": torch.randn(16, generator=gen) * 0.5}


def test_a_stacked_gradients_layers_sum_their_partials_in_one_reduction() -> None:
    g = compile_source(LAYERS).optimized.main
    by_id = g.by_id
    # no second stage of [128 or 16, 16] partials is placed into the stacked gradient
    placed = [n for n in g.nodes if n.op is Op.UNINDEX and by_id[n.inputs[0]].op is Op.SUM
              and by_id[n.inputs[0]].attr("dim") == 0]
    assert placed == []
    # each layer's first stage [16, 16] placed whole into [3, 16, 16]
    assert sorted(tuple(n.shape) for n in g.nodes if n.op is Op.UNINDEX) == [(3, 16, 16)] * 3
    stacked = [n for n in g.nodes if n.op is Op.SUM and n.attr("dim") == 1 and tuple(n.shape) == (3, 16)]
    assert len(stacked) == 1
    assert tuple(by_id[stacked[0].inputs[0]].shape) == (3, 16, 16)      # [L, P = 1024 / 64, C]
    # d's gradient (one placement-free reduction) keeps its two stages
    assert any(n.op is Op.SUM and n.attr("dim") == 0 and tuple(n.shape) == (16,) for n in g.nodes)
    for seed in (0, 1):
        inputs = _inputs(seed)
        got = _run(g, inputs)
        b = inputs["B"].double().requires_grad_()
        d = inputs["D"].double().requires_grad_()
        h = inputs["X"].double()
        for layer in range(3):
            h = torch.tanh(h + b[layer])
        ((h * h).sum() + torch.tanh(inputs["X"].double() + d).sum()).backward()
        for have, want in zip(got, (b.grad, d.grad)):
            assert float((have.double() - want).norm() / want.norm()) < 1e-12


def test_one_placement_alone_is_left_as_it_was() -> None:
    g = compile_source(LAYERS.replace("L = 3", "L = 1")).optimized.main
    assert not any(n.op is Op.SUM and n.attr("dim") == 1 and len(n.shape) == 2 and n.shape[0] == 1
                   and len(g.node(n.inputs[0]).shape) == 3 for n in g.nodes)


def test_stacked_partials_kernels_match_float64_under_the_interpreter() -> None:
    report = interpreted_report(HERE / "interpret_stack_partials.py")
    assert report["kinds"].count("rowwise") >= 2, report
    assert report["errors"] and all(err < 1e-6 for err in report["errors"]), report
