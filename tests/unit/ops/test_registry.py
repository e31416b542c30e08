"""The op registry is complete: every op has what each consumer of it needs, so an op added with a
missing piece fails here rather than quietly in a later stage."""

from __future__ import annotations

import pytest

from xgbuild.compiler import ops
from xgbuild.compiler.codegen.schedule import ELEMENTWISE
from xgbuild.compiler.frontend.builtins import SPECS
from xgbuild.compiler.ops import Kind, Op, Operands, op_def
from xgbuild.runtime.cpu import EXECUTOR_OPS

# Ops autodiff cannot differentiate yet (it says so, naming the op): anything else needs a VJP.
NOT_DIFFERENTIABLE_YET = {Op.GATHER, Op.SCATTER_ADD, Op.EXTERN, Op.CALL, Op.PROJ, Op.ATTN_LSE, Op.ATTN_GRAD}
ELEMENTWISE_KINDS = {Kind.UNARY, Kind.BINARY, Kind.SELECT}
# Ops of function graphs, gone once calls are inlined: no executor ever sees them.
INLINED_AWAY = {Op.CALL, Op.PROJ, Op.PARAM}


def test_every_op_is_defined_once_with_a_shape_rule() -> None:
    assert set(ops.REGISTRY) == set(Op)
    for op, d in ops.REGISTRY.items():
        assert d.op is op
        assert callable(d.infer), op
        assert d.arity is None or d.arity >= 0, op


@pytest.mark.parametrize("op", sorted(Op, key=lambda o: o.value), ids=lambda o: o.value)
def test_every_op_has_a_vjp_or_is_known_not_to(op: Op) -> None:
    d = op_def(op)
    if op in NOT_DIFFERENTIABLE_YET:
        assert d.vjp is None
    else:
        assert callable(d.vjp), f"`{op.value}` has no VJP"


@pytest.mark.parametrize("op", sorted(Op, key=lambda o: o.value), ids=lambda o: o.value)
def test_every_op_has_cpu_semantics(op: Op) -> None:
    """The CPU reference runs every op: by its definition, or (state it needs) by the executor."""
    if op in INLINED_AWAY:
        assert op_def(op).cpu is None and op not in EXECUTOR_OPS
    else:
        assert (op_def(op).cpu is None) == (op in EXECUTOR_OPS), op


@pytest.mark.parametrize("op", sorted(ELEMENTWISE, key=lambda o: o.value), ids=lambda o: o.value)
def test_every_fusable_op_has_triton_code(op: Op) -> None:
    assert op_def(op).triton is not None, f"`{op.value}` fuses into element-wise kernels but has no Triton code"


def test_element_wise_ops_fuse_and_fold() -> None:
    for d in ops.REGISTRY.values():
        if d.kind in ELEMENTWISE_KINDS:
            assert d.op in ELEMENTWISE, d.op
            assert d.cpu is not None and d.triton is not None, d.op
        if d.foldable:
            assert d.cpu is not None and d.kind in ELEMENTWISE_KINDS, d.op


def test_builtins_and_importer_names_point_at_their_definitions() -> None:
    for name, op in ops.BUILTINS.items():
        assert op_def(op).builtin == name
        assert name in SPECS, f"builtin `{name}` is not known to the checker"
    for name, op in ops.ATEN.items():
        assert name.startswith("aten.") and name in op_def(op).aten
    for name, op in ops.ONNX.items():
        assert name[0].isupper() and name in op_def(op).onnx
    for name, op in ops.UNARY_BUILTINS.items():
        d = op_def(op)
        assert d.kind is Kind.UNARY and d.arity == 1
        assert d.operands in (Operands.FLOAT, Operands.NUMERIC), name


def test_triton_code_is_written_from_the_operands() -> None:
    ctx = ops.TritonCtx(("x0", "x1", "x2"), "float32", "float32", {}, "i", lambda d: "tl." + d, repr)
    for d in ops.REGISTRY.values():
        if d.kind in ELEMENTWISE_KINDS:
            code = d.triton_code(ctx)
            assert "x0" in code, d.op
            if d.arity and d.arity >= 2:
                assert "x1" in code, d.op


def test_broadcast_rule() -> None:
    assert ops.broadcast((4, 1, 3), (5, 1)) == (4, 5, 3)
    assert ops.broadcast(("T", 1), (7,)) == ("T", 7)
    with pytest.raises(ops.BroadcastError) as info:
        ops.broadcast((4, 3), (5, 3))
    assert (info.value.x, info.value.y) == (4, 5)
    assert ops.broadcast(("T",), ("S",), lambda x, y: x) == ("T",)
