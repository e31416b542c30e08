"""`for l in range(N) { ... }` (frontend/loops.py): unrolled over constant bounds, with gradients
flowing through each iteration's index into the stacked weights. The error paths are in
cases/loops.xg."""

import numpy as np
import torch

from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.frontend import CheckOptions, check_source
from xgbuild.compiler.ir.graph import Op

STACKED = """
L = 3
D = 4
extern Tensor[float64, L, D, D] W
extern Tensor[float64, L, D] G
extern Tensor[float64, 2, D] X

def f(Tensor[float64, L, D, D] w, Tensor[float64, L, D] g, Tensor[float64, 2, D] x) -> float64 {
    for l in range(L) {
        h = x @ w[l]
        x = tanh(h) * g[l] + x
    }
    return sum(x * x)
}

def main() {
    return value_and_grad(f, wrt=(w, g))(W, G, X)
}
"""


def test_gradients_flow_into_every_layer_of_stacked_weights() -> None:
    engine = engine_of(compile_source(STACKED, "stacked.xg"))
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    w = torch.randn(3, 4, 4, generator=gen, dtype=torch.float64) / 2
    g = 1 + 0.1 * torch.randn(3, 4, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    loss, (gw, gg) = engine.run({"W": w, "G": g, "X": x}).value

    w_, g_ = w.clone().requires_grad_(), g.clone().requires_grad_()
    h = x
    for l in range(3):
        h = torch.tanh(h @ w_[l]) * g_[l] + h
    ref = (h * h).sum()
    ref.backward()
    assert abs(float(loss) - ref.item()) < 1e-12 * abs(ref.item())
    for got, want in ((gw, w_.grad), (gg, g_.grad)):
        assert float((got - want).norm() / want.norm()) < 1e-12
        assert all(float(want[l].norm()) > 0 for l in range(3))


def test_the_loop_is_straight_line_code_in_the_graph() -> None:
    """Three iterations: three constant indices of W, three matmuls, no loop left."""
    src = STACKED.replace("return value_and_grad(f, wrt=(w, g))(W, G, X)", "return f(W, G, X)")
    graph = compile_source(src, "stacked.xg").lowered.functions["f"]
    picks = sorted(n.attr("items")[0][1] for n in graph.nodes
                   if n.op is Op.INDEX and graph.node(n.inputs[0]).shape == (3, 4, 4))
    assert picks == [0, 1, 2]
    assert sum(n.op is Op.MATMUL for n in graph.nodes) == 3


def test_nested_loops_start_and_the_variable_as_a_constant() -> None:
    src = """
extern Tensor[float32, 5] X
def main() {
    y = X
    for i in range(1, 3) {
        for j in range(i) {
            y = y * cast(i * 10 + j, float32)
        }
    }
    return y
}
"""
    engine = engine_of(compile_source(src, "nested.xg"))
    x = torch.rand(5) + 0.5
    assert torch.allclose(engine.run({"X": x}).value, x * 10 * 20 * 21)


def test_copies_have_node_ids_of_their_own() -> None:
    result = check_source(STACKED, "stacked.xg")
    assert result.ok, result.render()
    program = result.program
    (copies,) = program.unrolled.values()
    assert [value for value, _ in copies] == [0, 1, 2]
    ids = [[], [], []]
    for k, (_, block) in enumerate(copies):
        stack = [block]
        while stack:
            node = stack.pop()
            if hasattr(node, "nid"):
                ids[k].append(node.nid)
                stack.extend(getattr(node, f) for f in node.__dataclass_fields__ if f not in ("nid", "span"))
            elif isinstance(node, list):
                stack.extend(node)
    flat = [i for block in ids for i in block]
    assert len(flat) == len(set(flat))


def test_nested_loops_are_bounded_in_total() -> None:
    src = """
extern Tensor[float32, 4] X
def main() {
    y = X
    for i in range(100) {
        for j in range(1000) {
            y = y * 0.5
        }
    }
    return y
}
"""
    result = check_source(src, "many.xg")
    assert [d.code for d in result.diagnostics] == ["XG0008"], result.render()
    assert "loop iterations to unroll" in result.render()


def test_an_empty_loop_runs_nothing_and_is_still_checked() -> None:
    src = """
N = 0
extern Tensor[float32, 4] X
def main() {
    y = X
    for i in range(N) {
        y = y + true
    }
    return y
}
"""
    result = check_source(src, "empty.xg")
    assert [d.code for d in result.diagnostics] == ["XG0100"], result.render()
    ok = engine_of(compile_source(src.replace("y + true", "y + 1.0"), "empty.xg"))
    x = torch.rand(4)
    assert torch.equal(ok.run({"X": x}).value, x)


def test_zero_layers_index_nothing() -> None:
    """`--const L=0` on a model of stacked weights: the block is checked once with the variable
    unknown (no iteration gives it a value), so `W[l]` into a dim of size 0 is no error."""
    result = check_source(STACKED, "stacked.xg", CheckOptions(consts=(("L", 0),)))
    assert result.ok, result.render()
    engine = engine_of(compile_source(STACKED, "stacked.xg", CheckOptions(consts=(("L", 0),))))
    x = torch.rand(2, 4, dtype=torch.float64)
    loss, (gw, gg) = engine.run({"W": torch.zeros(0, 4, 4, dtype=torch.float64),
                                 "G": torch.zeros(0, 4, dtype=torch.float64), "X": x}).value
    assert float(loss) == float((x * x).sum()) and gw.shape == (0, 4, 4) and gg.shape == (0, 4)


def test_the_loop_variable_is_no_external_after_the_loop() -> None:
    src = "extern Tensor[float32, 4] X\ndef main() {\n    y = X\n    for i in range(2) {\n        y = y * 2.0\n    }\n" \
          "    return y, i\n}\n"
    result = check_source(src, "after.xg")
    assert [d.code for d in result.diagnostics] == ["XG0103"], result.render()
