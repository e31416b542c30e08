"""The ops that transformers' ONNX exports use, one at a time (graphs built with onnx.helper),
against numpy / torch in float64 (issue 20)."""

from __future__ import annotations

import pytest
import torch

import hf_zoo
from xgbuild.build.engines import model_engine
from xgbuild.build.target import target_profile
from xgbuild.compiler.importers.onnx_import import import_onnx
from xgbuild.runtime.model_engine import ModelEngine
from xgbuild.settings import Settings

onnx = pytest.importorskip("onnx")
TOL = 1e-4


def engine_of(path) -> ModelEngine:
    imported = import_onnx(path, verify_each=True)
    return ModelEngine(model_engine(imported, target_profile(imported.target), Settings(), kernels=False))


# --- the ops those exports use, one at a time (graphs built with onnx.helper) ------------------
def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=18):
    from onnx import helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _ints(name: str, values) -> object:
    import numpy as np
    from onnx import numpy_helper
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def test_symbolic_shape_arithmetic(tmp_path) -> None:
    """Shape -> Gather -> Range with a symbolic limit; Unsqueeze and Cast of a scalar size; a size
    used as data (x / seq); Concat of shape vectors into a Reshape target; Equal and Where on a
    shape vector into an Expand: symbols end to end."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),            # scalar: seq
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),           # scalar: batch
        helper.make_node("Range", ["zero", "n", "one"], ["r"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["x", "nf"], ["xd"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["rf", "axis1"], ["rf2"]),
        helper.make_node("Add", ["xd", "rf2"], ["y"]),
        helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["y", "target"], ["flat"]),
        helper.make_node("Equal", ["target", "minus1"], ["free"]),           # [False, True]
        helper.make_node("Where", ["free", "one", "target"], ["eshape"]),     # [batch, 1]
        helper.make_node("Expand", ["half", "eshape"], ["e"]),
        helper.make_node("Add", ["flat", "e"], ["out"]),
    ]
    inits = [_ints("zero", 0), _ints("one", 1), _ints("axis0", [0]), _ints("axis1", [1]), _ints("minus1", [-1]),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "m"])], inits)
    engine = engine_of(path)
    assert engine.signature[0]["shape"] == ["batch", "seq", 4]
    for batch, seq in ((2, 5), (3, 11)):
        x = torch.randn(batch, seq, 4, dtype=torch.float64)
        ref = (x / seq + torch.arange(seq, dtype=torch.float64)[:, None]).reshape(batch, -1) + 0.5
        assert hf_zoo.rel_err(engine(x.float()), ref) < TOL


def test_gathers_without_selection_matmuls(tmp_path) -> None:
    """A static table sliced to a symbolic length (position ids [:, :seq]) and read at them; Gather
    at non-contiguous constant indices; Gather of run-time indices along axis 1: GATHERs, no MATMUL."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from xgbuild.compiler.ir.graph import Op
    rng = np.random.default_rng()
    table = rng.standard_normal((32, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["ids"], ["s"], start=1, end=2),
        helper.make_node("Slice", ["pos", "zero1", "s", "one1"], ["p"]),     # pos[:, :seq]
        helper.make_node("Gather", ["table", "p"], ["pe"], axis=0),          # [1, seq, 6]
        helper.make_node("Gather", ["pe", "cols"], ["pc"], axis=2),          # columns 4, 0, 2
        helper.make_node("Gather", ["pc", "ids"], ["g"], axis=1),            # [1, batch, seq, 3]
    ]
    inits = [numpy_helper.from_array(table, "table"), _ints("pos", np.arange(32)[None]), _ints("zero1", [0]),
             _ints("one1", [1]), _ints("cols", [4, 0, 2])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                 [helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, "batch", "seq", 3])], inits)
    ops = [n.op for n in import_onnx(path).optimized.main.nodes]
    assert Op.GATHER in ops and Op.MATMUL not in ops
    engine = engine_of(path)
    for batch, seq in ((2, 5), (3, 9)):
        ids = torch.from_numpy(rng.integers(-seq, seq, (batch, seq)))
        pc = table[:seq][None][:, :, [4, 0, 2]]                                # [1, seq, 3]
        ref = np.take(pc, np.where(ids.numpy() < 0, ids.numpy() + seq, ids.numpy()), axis=1)
        assert hf_zoo.rel_err(engine(ids), torch.from_numpy(ref)) < TOL
