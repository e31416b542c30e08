"""ONNX import of the five example models, exported with torch.onnx (dynamo exporter), against
float64 eager on fresh inputs; a dynamic batch dim; ONNX-specific ops built with onnx.helper."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch

from xgbuild.build.engines import model_engine
from xgbuild.build.target import target_profile
from xgbuild.compiler.importers.onnx_import import import_onnx
from xgbuild.runtime.model_engine import ModelEngine
from xgbuild.settings import Settings
from zoo import NAMES, TOL, as_tuple, fresh_inputs, make, reference, rel_err

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")


def export(model, inputs, path, dynamic_shapes=None) -> None:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dynamic_shapes)


def engine_of(path, **kw) -> ModelEngine:
    imported = import_onnx(path, verify_each=True, **kw)
    return ModelEngine(model_engine(imported, target_profile(imported.target), Settings(), kernels=False))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("onnx")
    out = {}
    for name in NAMES:
        model, inputs, dyn = make(name)
        path = d / f"{name}.onnx"
        export(model, inputs, path, dyn if name in ("gpt", "bert") else None)
        out[name] = (model, path)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_matches_eager(exported, name: str) -> None:
    model, path = exported[name]
    engine = engine_of(path)
    inputs = fresh_inputs(name)
    got = as_tuple(engine(*inputs))
    refs = reference(model, inputs)
    assert len(got) == len(refs)
    for y, r in zip(got, refs):
        assert rel_err(y, r) < TOL, f"{name}: {rel_err(y, r):.2e}"


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_dynamic_batch(exported, name: str) -> None:
    model, path = exported[name]
    engine = engine_of(path)
    assert engine.signature[0]["shape"] == ["batch", 16]
    for batch in (1, 4):
        inputs = fresh_inputs(name, batch)
        y = as_tuple(engine(*inputs))[0]
        assert y.shape[0] == batch
        assert rel_err(y, reference(model, inputs)[0]) < TOL


def _model(nodes, inputs, outputs, inits=(), opset=17):
    from onnx import helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_onnx_specific_ops(tmp_path) -> None:
    """Gemm with transposes and alpha/beta, BatchNormalization, Flatten, Clip, Reciprocal, Split with
    sizes, Concat, Slice with steps, Where, Pow, ReduceSum with axes as an input (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng()
    w = rng.standard_normal((6, 4)).astype(np.float32)
    c = rng.standard_normal((6,)).astype(np.float32)
    scale, bias = rng.random(6).astype(np.float32) + 0.5, rng.standard_normal(6).astype(np.float32)
    mean, var = rng.standard_normal(6).astype(np.float32) * 0.1, rng.random(6).astype(np.float32) + 0.5
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w, "w"), (c, "c"), (scale, "s"), (bias, "b"), (mean, "m"), (var, "v"),
              (np.array([2, 4], np.int64), "sizes"), (np.array([1], np.int64), "axes1"),
              (np.array([2], np.int64), "axes2"),
              (np.array([0], np.int64), "st"), (np.array([6], np.int64), "en"), (np.array([2], np.int64), "sp"),
              (np.array(2.0, np.float32), "two"), (np.array(-0.5, np.float32), "lo"), (np.array(0.5, np.float32), "hi")]]
    nodes = [
        helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Unsqueeze", ["g", "axes2"], ["g3"]),
        helper.make_node("BatchNormalization", ["g3", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
        helper.make_node("Flatten", ["bn"], ["f"], axis=1),
        helper.make_node("Clip", ["f", "lo", "hi"], ["cl"]),
        helper.make_node("Split", ["f", "sizes"], ["p1", "p2"], axis=1),
        helper.make_node("Concat", ["p2", "p1"], ["cat"], axis=1),
        helper.make_node("Slice", ["cat", "st", "en", "axes1", "sp"], ["sl"]),
        helper.make_node("Pow", ["sl", "two"], ["sq"]),
        helper.make_node("Greater", ["sl", "lo"], ["gt"]),
        helper.make_node("Where", ["gt", "sq", "sl"], ["wh"]),
        helper.make_node("Reciprocal", ["s"], ["rs"]),
        helper.make_node("Mul", ["cl", "rs"], ["mul"]),
        helper.make_node("ReduceSum", ["mul", "axes1"], ["red"], keepdims=1),
        helper.make_node("Add", ["red", "wh"], ["y"]),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3])], inits)
    path = tmp_path / "ops.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((3, 4))
    g = 0.5 * x @ w.astype(np.float64).T + 2.0 * c
    bn = (g - mean) / np.sqrt(var.astype(np.float64) + 1e-3) * scale + bias
    cat = np.concatenate([bn[:, 2:], bn[:, :2]], axis=1)
    sl = cat[:, 0:6:2]
    wh = np.where(sl > -0.5, sl * sl, sl)
    red = (np.clip(bn, -0.5, 0.5) / scale).sum(axis=1, keepdims=True)
    got = engine_of(path)(torch.from_numpy(x.astype(np.float32)))
    assert rel_err(got, torch.from_numpy(red + wh)) < TOL


def test_onnx_activations(tmp_path) -> None:
    from onnx import TensorProto, helper
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.3), helper.make_node("Elu", ["x"], ["b"]),
             helper.make_node("HardSigmoid", ["x"], ["c"]), helper.make_node("HardSwish", ["x"], ["d"]),
             helper.make_node("Softplus", ["x"], ["e"]), helper.make_node("Sum", ["a", "b", "c", "d", "e"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])])
    onnx.save(model, str(tmp_path / "act.onnx"))
    x = torch.randn(4, 5, dtype=torch.float64) * 3
    ref = (torch.where(x > 0, x, 0.3 * x) + torch.nn.functional.elu(x) + (0.2 * x + 0.5).clamp(0, 1)
           + x * (x / 6 + 0.5).clamp(0, 1) + torch.log1p(torch.exp(x)))
    assert rel_err(engine_of(tmp_path / "act.onnx")(x.float()), ref) < TOL


def test_gather_of_run_time_indices_is_a_gather_checked_for_range(tmp_path) -> None:
    """Gather on axis 0 at run-time indices (2-D here): rows of the table, the indices' range checked."""
    import xg
    from onnx import TensorProto, helper, numpy_helper
    from xgbuild.compiler.ir.graph import Op
    rng = np.random.default_rng()
    table = rng.standard_normal((9, 4)).astype(np.float32)
    model = _model([helper.make_node("Gather", ["w", "i"], ["g"], axis=0), helper.make_node("Relu", ["g"], ["y"])],
                   [helper.make_tensor_value_info("i", TensorProto.INT64, ["batch", 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 4])],
                   [numpy_helper.from_array(table, "w")])
    path = tmp_path / "gather.onnx"
    onnx.save(model, str(path))
    ops = [n.op for n in import_onnx(path).optimized.main.nodes]
    assert Op.GATHER in ops and Op.MATMUL not in ops
    engine = engine_of(path)
    idx = torch.from_numpy(rng.integers(-9, 9, (5, 3)))          # negative: counted from the end, as ONNX says
    idx[0, 0], idx[0, 1] = -9, -1
    assert torch.equal(engine(idx), torch.from_numpy(np.maximum(np.take(table, idx.numpy(), axis=0), 0)))
    idx[2, 1] = 9
    with pytest.raises(xg.InputError, match=r"input `i` holds 9, outside \[-9, 9\)"):
        engine(idx)
    idx[2, 1] = -10
    with pytest.raises(xg.InputError, match=r"input `i` holds -10, outside \[-9, 9\)"):
        engine(idx)


def test_import_raises_no_deprecation_warning(tmp_path) -> None:
    """XG's own code warns about nothing deprecated (it printed the graph with
    onnx.helper.printable_graph, deprecated since onnx 1.16)."""
    from onnx import TensorProto, helper, save
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]), tmp_path / "relu.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        imported = import_onnx(tmp_path / "relu.onnx")
    assert "Relu" in imported.source
