"""The fusion pass: every computed node lands in exactly one kernel, kernels come in dependency
order, and the patterns the benchmark (docs/codegen.md) times fuse into the expected kernels."""

from pathlib import Path

import pytest

from xgbuild.compiler.codegen.schedule import ScheduleError, schedule
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.ir.graph import Op

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.xg"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_partition_is_complete_and_ordered(path: Path) -> None:
    g = compile_file(path).optimized.main
    s = schedule(g)
    # Index expressions only attention kernels read (a causal mask) are computed inside them.
    computed = [n.id for n in g.nodes if n.op not in (Op.INPUT, Op.CONST) and n.id not in s.views | s.inlined]
    in_kernels = [nid for k in s.kernels for nid in k.nodes]
    assert sorted(in_kernels) == sorted(computed)
    written: set[int] = {n.id for n in g.nodes if n.op is Op.INPUT}
    base = {}
    for n in g.nodes:
        if n.id in s.views:
            base[n.id] = base.get(n.inputs[0], n.inputs[0])
    for k in s.kernels:
        for i in s.inputs(k):
            assert base.get(i, i) in written, f"{k.name} reads %{i} before any kernel writes it"
        written.update(s.outputs(k))


def test_rmsnorm_and_softmax_fuse_into_one_row_kernel() -> None:
    s = schedule(compile_file(REPO / "examples" / "norms.xg").optimized.main)
    assert [k.kind for k in s.kernels] == ["rowwise"]


def test_mlp_bias_and_gelu_are_a_matmul_epilogue() -> None:
    g = compile_file(REPO / "examples" / "mlp.xg").optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels] == ["matmul", "matmul"]
    first = [g.node(i).op for i in s.kernels[0].nodes]
    assert first == [Op.MATMUL, Op.ADD, Op.GELU]


@pytest.mark.parametrize("k,fused", [(512, False), (1536, False), (4096, True)])
def test_gelu_joins_only_long_k_products(k: int, fused: bool) -> None:
    # libdevice's erf repeats for every accumulator element of a thread: after a short main loop it
    # is an element-wise kernel of its own (schedule.UNROLLED_EPILOGUE).
    # (products of enough tiles that split-products leaves them whole)
    src = (f"extern Tensor[bfloat16, 8192, {k}] X\nextern Tensor[bfloat16, {k}, 4096] W\n"
           f"extern Tensor[bfloat16, 4096] B\nextern Tensor[bfloat16, 4096, {k}] W2\n"
           "def main() {\n    return gelu(X @ W + B) @ W2\n}\n")
    g = compile_source(src).optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels] == (["matmul", "matmul"] if fused else ["matmul", "elementwise", "matmul"])
    assert [g.node(i).op for i in s.kernels[0].nodes] == [Op.MATMUL, Op.ADD] + ([Op.GELU] if fused else [])


def test_product_written_anyway_is_not_given_an_epilogue() -> None:
    # contract.xg: y = A @ B feeds rmsnorm twice (x * x and x * rsqrt(...)): the square belongs in
    # the row kernel's prologue, not in the matmul's epilogue (which would write a second tensor).
    g = compile_file(REPO / "examples" / "contract.xg").optimized.main
    s = schedule(g)
    assert [k.kind for k in s.kernels] == ["matmul", "rowwise"]
    assert s.kernels[0].nodes == [s.kernels[0].anchor]


def test_unindex_starts_an_elementwise_kernel_that_consumers_join() -> None:
    # The gradient of an indexed read places its input into zeros (`unindex`); it reads that input
    # at other positions than its own, so it is never fused after it, but its consumers join it.
    src = ("extern Tensor[float32, 4, 6] X\ndef f(Tensor[float32, 4, 6] x) -> Tensor[float32] {\n"
           "    return sum(x[1] * x[1])\n}\ndef main() {\n    return grad(f, wrt=x)(X) + X\n}\n")
    g = compile_source(src).optimized.main
    s = schedule(g)
    last = s.kernels[-1]
    assert last.kind == "elementwise" and g.node(last.nodes[0]).op is Op.UNINDEX and len(last.nodes) > 1
    assert all(g.node(i).op is not Op.UNINDEX for k in s.kernels[:-1] for i in k.nodes)


def test_every_ir_op_has_a_kernel_path_or_is_a_view() -> None:
    from xgbuild.compiler.codegen.schedule import ELEMENTWISE, FLASH, GATHERS, ROW_ANCHORS, SCATTERS, VIEWS
    # Sources and function-level ops never reach the schedule: inputs and constants are read,
    # PARAM/CALL/PROJ are gone after inlining. EXTERN is a step of its own (PyTorch, between kernels),
    # and so is each of attention's backward ops (FLASH) and each scatter-add (SCATTERS).
    assert GATHERS == {Op.UNINDEX, Op.GATHER} and FLASH == {Op.ATTN_LSE, Op.ATTN_GRAD}
    assert SCATTERS == {Op.SCATTER_ADD}
    covered = ELEMENTWISE | ROW_ANCHORS | VIEWS | GATHERS | FLASH | SCATTERS | {Op.MATMUL, Op.EXTERN, Op.INPUT, Op.CONST}
    assert set(Op) - covered == {Op.PARAM, Op.CALL, Op.PROJ}


def test_op_without_a_kernel_path_is_an_error() -> None:
    src = "extern Tensor[float32] X\ndef main() {\n    return softmax(X, dim=0)\n}\n"
    with pytest.raises(ScheduleError, match=r"`softmax` over a dimension other than the last"):
        schedule(compile_source(src).optimized.main)


@pytest.mark.parametrize("dim,reduced", [("dim=0", (0,)), ("", (0, 1))])
def test_reduction_over_other_dims_takes_the_element_wise_ops_it_alone_reads(dim: str, reduced: tuple) -> None:
    src = f"extern Tensor[float32, 4, 6] X\ndef main() {{\n    return sum(exp(X * 0.5){', ' + dim if dim else ''})\n}}\n"
    g = compile_source(src).optimized.main
    s = schedule(g)
    assert [(k.kind, k.reduce_dims) for k in s.kernels] == [("rowwise", reduced)]
    assert [g.node(i).op for i in s.kernels[0].nodes] == [Op.MUL, Op.EXP, Op.SUM]


@pytest.mark.parametrize("dim,reduced", [("dim=0", (0,)), ("", (0, 1))])
def test_a_strided_reductions_input_read_elsewhere_stays_a_kernel_of_its_own(dim: str, reduced: tuple) -> None:
    src = f"extern Tensor[float32, 4, 6] X\ndef main() {{\n    e = exp(X)\n    return sum(e{', ' + dim if dim else ''}), e\n}}\n"
    s = schedule(compile_source(src).optimized.main)
    assert [(k.kind, k.reduce_dims) for k in s.kernels] == [("elementwise", ()), ("rowwise", reduced)]


def test_a_widening_cast_is_a_strided_reductions_prologue() -> None:
    src = "extern Tensor[bfloat16, 4, 6] X\ndef main() {\n    return sum(cast(X, float32), dim=0)\n}\n"
    g = compile_source(src).optimized.main
    s = schedule(g)
    assert [(k.kind, k.reduce_dims) for k in s.kernels] == [("rowwise", (0,))]
    assert [g.node(i).dtype for i in s.inputs(s.kernels[0])] == ["bfloat16"]


def test_a_cast_only_products_read_joins_the_epilogue_of_a_product_written_anyway() -> None:
    # h is written for its column sum (a bias's gradient) and read, as bfloat16, by two products:
    # the epilogue writes both, no kernel reads h back to cast it.
    src = """extern Tensor[bfloat16, 64, 32] A
extern Tensor[bfloat16, 32, 48] B
extern Tensor[float32, 48] C
extern Tensor[bfloat16, 48, 16] W
def main() {
    h = cast(A @ B, float32) * C
    hb = cast(h, bfloat16)
    return sum(h, dim=0), hb @ W, transpose(A, dim0=0, dim1=1) @ hb
}
"""
    g = compile_source(src).optimized.main
    s = schedule(g)
    first = s.kernels[0]
    assert first.kind == "matmul" and sorted(g.node(i).dtype for i in s.outputs(first)) == ["bfloat16", "float32"]
    assert not any(k.kind == "elementwise" for k in s.kernels)
    # A cast with another reader that is not a product stays out (that reader's kernel takes it).
    other = src.replace("hb @ W, ", "hb @ W, hb * hb, ")
    g = compile_source(other).optimized.main
    assert [g.node(i).dtype for i in schedule(g).outputs(schedule(g).kernels[0])] == ["float32"]


def test_an_attentions_gradient_is_two_flash_kernels_beside_the_forward_one() -> None:
    """The forward attention kernel writes the log-sum-exp its gradient reads; dk and dv are one
    kernel; dq another."""
    src = """extern Tensor[bfloat16, 2, 16, 8] Q
extern Tensor[bfloat16, 2, 16, 8] K
extern Tensor[bfloat16, 2, 16, 8] V
def f(Tensor[bfloat16, 2, 16, 8] q, Tensor[bfloat16, 2, 16, 8] k, Tensor[bfloat16, 2, 16, 8] v) -> float32 {
    keep = reshape(arange(16), [16, 1]) >= reshape(arange(16), [1, 16])
    p = softmax(where(keep, cast(q @ transpose(k), float32) * 0.25, -1e9), dim=2)
    return sum(cast(cast(p, bfloat16) @ v, float32))
}
def main() {
    return grad(f, wrt=(q, k, v))(Q, K, V)
}
"""
    g = compile_source(src).optimized.main
    s = schedule(g)
    ops = {k.kind: [] for k in s.kernels}
    for k in s.kernels:
        ops[k.kind].append(sorted(g.node(i).attr("wrt") or g.node(i).op.value for i in k.nodes
                                  if g.node(i).op in (Op.ATTN_GRAD, Op.ATTN_LSE)))
    assert ops["attention"] == [["attn_lse"]] and sorted(ops["flash"]) == [["k", "v"], ["q"]]
    attention = next(k for k in s.kernels if k.kind == "attention")
    assert sorted(g.node(i).op.value for i in s.outputs(attention)) == ["attn_lse", "matmul"]
