"""The pass pipeline: each pass keeps the IR valid (the verifier runs between passes), leaves the
invariant its docstring names, and never changes what the program computes."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.ir.graph import Op, Program, tree_ids
from xgbuild.compiler.ir.verify import IRError, verify
from xgbuild.compiler.passes import PASS_NAMES, PIPELINE, run_pipeline
from xgbuild.compiler.passes.autodiff import autodiff
from xgbuild.compiler.passes.inline import inline
from xgbuild.compiler.passes.specialize import SpecializationError, bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.xg"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_pipeline_verifies_between_passes(path: Path) -> None:
    compiled = compile_file(path, verify_each=True)
    for g in list(compiled.lowered.functions.values()) + [compiled.lowered.main]:
        verify(g)
    verify(compiled.optimized.main)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_each_pass_invariant(path: Path) -> None:
    program = compile_file(path).lowered
    for name, fn in PIPELINE:
        program = fn(program)
        g = program.main
        verify(g)
        if name == "inline":
            assert not program.functions
            assert not any(n.op in (Op.CALL, Op.PROJ, Op.PARAM) for n in g.nodes)
        if name == "cse":
            keys = [n.key() for n in g.nodes if n.op is not Op.INPUT]
            assert len(keys) == len(set(keys))
        if name == "dce":
            live = set(tree_ids(g.output))
            for n in reversed(g.nodes):
                if n.id in live:
                    live.update(n.inputs)
            assert all(n.id in live or n.op is Op.INPUT for n in g.nodes)


def test_const_fold_evaluates_scalar_programs() -> None:
    g = compile_file(REPO / "examples" / "safe_div.xg").optimized.main
    assert all(n.op is Op.CONST for n in g.nodes)
    assert [g.node(i).attr("value") for i in tree_ids(g.output)] == [30, -1.0, 0.5]


def test_const_fold_rounds_in_the_node_dtype() -> None:
    src = "def main() {\n    x = cast(1.0, float16) + cast(0.0001, float16)\n    return x\n}\n"
    g = compile_source(src).optimized.main
    (out,) = [g.node(i) for i in tree_ids(g.output)]
    assert out.op is Op.CONST and out.attr("value") == 1.0      # 1 + 1e-4 rounds to 1 in float16


def test_cse_merges_repeated_work() -> None:
    src = ("extern Tensor[float32, 4, 4] X\ndef main() {\n    a = exp(X) * 2.0\n    b = exp(X) * 2.0\n"
           "    return a + b\n}\n")
    g = compile_source(src).optimized.main
    assert sum(n.op is Op.EXP for n in g.nodes) == 1


def test_dump_after_stops_early() -> None:
    path = REPO / "examples" / "contract.xg"
    after_inline = compile_file(path, stop_after="inline").optimized.main
    full = compile_file(path).optimized.main
    assert len(after_inline.nodes) > len(full.nodes)
    with pytest.raises(ValueError, match="unknown pass"):
        run_pipeline(compile_file(path).lowered, stop_after="nope")
    assert PASS_NAMES == ["precision", "autodiff", "inline", "const-fold", "simplify", "lookups", "cse",
                          "sink-reshapes", "dce", "stage", "shard", "split-reductions", "stack-partials",
                          "cast-views", "merge-heads", "pad-products", "transpose-products", "split-products", "fork-casts"]


def _random(dtype: str, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, dtype=torch.float64)
    return t.to(getattr(torch, dtype))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_optimisation_preserves_results(path: Path) -> None:
    compiled = compile_file(path)
    unoptimised = inline(autodiff(compiled.lowered)).main     # differentiated and inlined only
    optimised = compiled.optimized.main
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    sizes = {}
    inputs = {}
    for name, nid in optimised.inputs:
        n = optimised.node(nid)
        shape = tuple(d if isinstance(d, int) else sizes.setdefault(d, 6) for d in n.shape)
        inputs[name] = _random(n.dtype, shape, gen)
    results = []
    for g in (unoptimised, optimised):
        spec = specialize(g, bind_symbols(g, {k: tuple(v.shape) for k, v in inputs.items()}))
        out = CpuExecutor(float64=True).run(spec, inputs)
        results.append([out.values[i] for i in tree_ids(spec.output)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_verifier_rejects_broken_graphs() -> None:
    g = compile_file(REPO / "examples" / "norms.xg").optimized.main
    last = g.nodes[-1]
    with pytest.raises(IRError, match="not defined before use"):
        verify(g.with_nodes(g.nodes[:-1] + (replace(last, inputs=(999, last.inputs[1])),)))
    with pytest.raises(IRError, match="recorded"):
        verify(g.with_nodes(g.nodes[:-1] + (replace(last, shape=("T", "T")),)))
    with pytest.raises(IRError, match="unknown dtype"):
        verify(g.with_nodes(g.nodes[:-1] + (replace(last, dtype="float33"),)))
    with pytest.raises(IRError, match="defined twice"):
        verify(g.with_nodes(g.nodes + (g.nodes[-1],)))


def test_specialisation_checks_input_shapes() -> None:
    g = compile_file(REPO / "examples" / "contract.xg").optimized.main   # A[T,K] B[K,D] W[D]
    env = bind_symbols(g, {"A": (3, 5), "B": (5, 7), "W": (7,)})
    assert env == {"T": 3, "K": 5, "D": 7}
    spec = specialize(g, env)
    assert all(isinstance(d, int) for n in spec.nodes for d in n.shape)
    with pytest.raises(SpecializationError, match="K = 6"):
        bind_symbols(g, {"A": (3, 5), "B": (6, 7), "W": (7,)})
    with pytest.raises(SpecializationError, match="rank 2"):
        bind_symbols(g, {"A": (3, 5, 1), "B": (5, 7), "W": (7,)})


def test_specialisation_rechecks_fixed_dims() -> None:
    src = "extern Tensor[float32, 4, K] X\ndef main() {\n    return reshape(X, [2, 8])\n}\n"
    g = compile_source(src).optimized.main
    specialize(g, bind_symbols(g, {"X": (4, 4)}))
    with pytest.raises(SpecializationError, match="reshape"):
        specialize(g, bind_symbols(g, {"X": (4, 5)}))
    with pytest.raises(SpecializationError, match="dimension 0 must be 4"):
        bind_symbols(g, {"X": (3, 4)})


def test_program_replace_main_keeps_functions() -> None:
    p = compile_file(REPO / "examples" / "contract.xg").lowered
    assert isinstance(p, Program) and p.replace_main(p.main).functions == p.functions
