"""Every element-wise builtin in the registry, end to end: type-checked, lowered, differentiated,
run by the CPU reference, compiled into sm_90 kernels, imported from PyTorch (ATen) and from ONNX,
each compared with float64 torch on fresh random inputs. A new entry in compiler/ops is covered
here with no new test code (its kernels' numbers: tests/unit/codegen/test_kernels_interpreted.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import xg
from xgbuild.compiler import ops
from xgbuild.compiler.ops import Op, op_def

NAMES = sorted(ops.UNARY_BUILTINS)
ATEN_UNARY = sorted(name for name, op in ops.ATEN.items() if op in ops.UNARY)
ONNX_UNARY = sorted(name for name, op in ops.ONNX.items() if op in ops.UNARY and op_def(op).aten)
TOL = 2e-6


def torch_fn(name: str):
    """The float64 reference of a builtin: torch's function of the same name (`stop_gradient`:
    `detach`)."""
    if name == "stop_gradient":
        return torch.Tensor.detach
    return getattr(torch, name, None) or getattr(torch.nn.functional, name)


def aten_fn(name: str):
    return getattr(torch.ops.aten, name.removeprefix("aten."))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def operand(x: torch.Tensor, op: Op) -> torch.Tensor:
    """A positive argument (every float builtin's domain, provably positive for `rsqrt`), or a
    bool one for logical ops."""
    return x > 0 if op_def(op).operands is ops.Operands.ANY else x * x + 0.25


@pytest.mark.parametrize("name", NAMES)
def test_builtin_value_and_gradient(tmp_path: Path, name: str) -> None:
    src = tmp_path / f"{name}.xg"
    src.write_text(f"""extern Tensor[float32, T, D] X
def f(Tensor[float32, T, D] x) -> float32 {{
    return sum({name}(x * x + 0.25) * x)
}}
def main() {{
    return {name}(X * X + 0.25), grad(f, wrt=x)(X)
}}
""")
    engine = xg.compile_file(src, kernels=False)
    x = torch.randn(5, 7)
    value, gradient = xg.run_engine(engine, external_values={"X": x}).value
    xd = x.double().requires_grad_(True)
    ref = torch_fn(name)(xd * xd + 0.25)
    (ref * xd).sum().backward()
    assert rel_err(value, ref.detach()) < TOL, name
    assert rel_err(gradient, xd.grad) < 10 * TOL, name


def test_every_builtin_becomes_kernels_for_the_target(tmp_path: Path) -> None:
    """One program of all of them, built with sm_90 cubins: every op reaches a compiled kernel."""
    src = tmp_path / "all.xg"
    src.write_text("extern Tensor[float32, T, D] X\ndef main() {\n    return "
                   + ", ".join(f"{name}(X * X + 0.25)" for name in NAMES) + "\n}\n")
    engine = xg.compile_file(src, target="H100", dims={"T": 16, "D": 32})
    kernels = engine.manifest["kernels"]
    assert kernels and all(v["arch"] == 90 for k in kernels for v in k["variants"])
    fused = {node[0] for k in kernels for node in k["spec"]["nodes"]}
    # stop_gradient is the identity once gradients are taken: simplify drops it before kernels.
    assert {ops.UNARY_BUILTINS[name].value for name in NAMES if name != "stop_gradient"} <= fused
    x = torch.randn(16, 32)
    for name, got in zip(NAMES, xg.run_engine(engine, external_values={"X": x}).value):
        assert rel_err(got, torch_fn(name)(x.double() * x.double() + 0.25)) < TOL, name


@pytest.mark.parametrize("name", ATEN_UNARY)
def test_aten_import(name: str) -> None:
    op = ops.ATEN[name]
    fn = aten_fn(name)
    engine = xg.compile(lambda x: fn(operand(x, op)), (torch.randn(4, 6),), kernels=False)
    x = torch.randn(4, 6)
    got, ref = engine(x), fn(operand(x.double(), op))
    if ref.dtype == torch.bool:
        assert torch.equal(got, ref)
    else:
        assert rel_err(got, ref) < TOL, name


@pytest.mark.parametrize("name", ONNX_UNARY)
def test_onnx_import(tmp_path: Path, name: str) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from xgbuild.build.engines import model_engine
    from xgbuild.build.target import target_profile
    from xgbuild.compiler.importers.onnx_import import import_onnx
    from xgbuild.runtime.model_engine import ModelEngine
    from xgbuild.settings import Settings

    op = ops.ONNX[name]
    logical = op_def(op).operands is ops.Operands.ANY
    kind = TensorProto.BOOL if logical else TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node(name, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", kind, [4, 5])],
                              [helper.make_tensor_value_info("y", kind, [4, 5])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    imported = import_onnx(tmp_path / "m.onnx", verify_each=True)
    engine = ModelEngine(model_engine(imported, target_profile(imported.target), Settings(), kernels=False))
    x = torch.randn(4, 5)
    x = x > 0 if logical else x * x + 0.25
    got, ref = engine(x), aten_fn(op_def(op).aten[0])(x if logical else x.double())
    if logical:
        assert torch.equal(got, ref)
    else:
        assert rel_err(got, ref) < TOL, name
