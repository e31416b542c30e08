"""Imported models end to end: `xg.compile(...).save()` and `xgc model.onnx --out` give engines that
`xgrun` runs (seeded inputs, index inputs inside their tables); bad .onnx files fail cleanly with
xgc's documented exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import xg
from conftest import assert_clean_failure, cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
from torch_models import make  # noqa: E402

onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def gpt_onnx(tmp_path_factory):
    pytest.importorskip("onnxscript")
    model, inputs, dyn = make("gpt")
    path = tmp_path_factory.mktemp("onnx") / "gpt.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dyn)
    return model, path


def test_xg_compile_engine_runs_in_xgrun(tmp_path) -> None:
    model, inputs, _ = make("resnet")
    engine = xg.compile(model, inputs, kernels=False)
    path = tmp_path / "resnet.xge"
    engine.save(path)
    res = cli("xgrun", path, "--seed", "1", "--json", "--output", tmp_path / "out.safetensors")
    assert res.code == 0, res.both
    summary = json.loads(res.out)
    assert summary["outputs"]["out"]["shape"] == [2, 10]
    from safetensors.torch import load_file
    x = load_file(tmp_path / "out.safetensors")["out"]
    assert torch.isfinite(x).all()


def test_xgc_onnx_to_xgrun(gpt_onnx, tmp_path) -> None:
    model, path = gpt_onnx
    out = tmp_path / "gpt.xge"
    res = cli("xgc", path, "--no-kernels", "--out", out)
    assert res.code == 0, res.both
    assert "wrote" in res.err
    res = cli("xgrun", out, "--seed", "1", "--dim", "batch=3", "--json")
    assert res.code == 0, res.both
    summary = json.loads(res.out)
    assert summary["outputs"]["out"]["shape"] == [3, 16, 64]
    assert summary["specialization"]["symbols"] == {"batch": 3}


def test_xgc_onnx_same_bytes_twice(gpt_onnx, tmp_path) -> None:
    _, path = gpt_onnx
    a, b = tmp_path / "a.xge", tmp_path / "b.xge"
    assert cli("xgc", path, "--no-kernels", "--out", a).code == 0
    assert cli("xgc", path, "--no-kernels", "--out", b).code == 0
    assert a.read_bytes() == b.read_bytes()


def test_xgc_onnx_emit_ir(gpt_onnx) -> None:
    _, path = gpt_onnx
    res = cli("xgc", path, "--emit", "ir-opt")
    assert res.code == 0, res.both
    assert "matmul" in res.out and "softmax" in res.out and 'name="idx"' in res.out


def test_missing_file() -> None:
    res = cli("xgc", "no/such/model.onnx", "--out", "x.xge")
    assert_clean_failure(res, "cannot read no/such/model.onnx: no such file", code=2)


def test_corrupt_file(gpt_onnx, tmp_path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(gpt_onnx[1].read_bytes()[:500])
    res = cli("xgc", bad, "--out", tmp_path / "x.xge")
    assert_clean_failure(res, "is not a readable ONNX model", code=2)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert_clean_failure(cli("xgc", empty, "--out", tmp_path / "x.xge"), "holds no ONNX graph", code=2)


def test_unsupported_ops_listed(tmp_path) -> None:
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Tan", ["x"], ["a"], name="first_tan"),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("TopK", ["b", "k"], ["c", "i"], name="topk")]
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 2])], [k])
    path = tmp_path / "unsupported.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    res = cli("xgc", path, "--out", tmp_path / "x.xge")
    assert_clean_failure(res, "unsupported.onnx uses 2 unsupported ops", code=1)
    assert "Tan at node `first_tan`" in res.err and "TopK at node `topk`" in res.err
    assert not (tmp_path / "x.xge").exists()


def test_same_model_same_bytes_across_processes(tmp_path) -> None:
    """xg.compile in two processes (other hash seeds, time zones, directories): identical engines."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from torch_models import make; import xg; "
              "m, i, d = make('vit'); xg.compile(m, i, kernels=False, dynamic_shapes=d).save(sys.argv[2])")
    outs = []
    for k, (seed, tz) in enumerate([("1", "UTC"), ("999", "Asia/Kolkata")]):
        out = tmp_path / f"run{k}" / "vit.xge"
        out.parent.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed, "TZ": tz}
        proc = subprocess.run([sys.executable, "-c", script, str(EXAMPLES), str(out)], capture_output=True, text=True,
                              env=env, cwd=str(out.parent), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
