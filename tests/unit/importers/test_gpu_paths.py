"""The GPU half, checked on a CPU: every op the importers emit has a GPU kernel path.

- the five example models' kernels (as engines carry them), and those of an ONNX import, run under
  Triton's interpreter and match the float64 CPU reference, at another batch size than the one they
  were tuned at;
- engines for an H100 cross-compile their cubins here (tune=predict) and still run in xgrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import xg
from zoo import NAMES, TOL, make

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("name", NAMES)
def test_kernels_match_reference_under_interpreter(name: str) -> None:
    proc = subprocess.run([sys.executable, str(HERE / "interpret_model.py"), name], capture_output=True, text=True,
                          timeout=600, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report
    for out in report:
        assert out["rel_err"] < TOL, f"{name}: output %{out['node']} {out['rel_err']:.2e}"


def test_onnx_import_kernels_match_reference_under_interpreter(tmp_path) -> None:
    pytest.importorskip("onnxscript")
    import contextlib
    import io
    import warnings

    import torch
    model, inputs, dyn = make("gpt")
    path = tmp_path / "gpt.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dyn)
    proc = subprocess.run([sys.executable, str(HERE / "interpret_model.py"), "gpt", "--onnx", str(path)],
                          capture_output=True, text=True, timeout=600, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report and all(out["rel_err"] < TOL for out in report), report


def test_attention_writes_merged_heads_under_interpreter() -> None:
    """transformers' Llama (grouped-query) in bfloat16 and GPT-2 in float32: each attention kernel
    writes its output as `o.transpose(1, 2).reshape(B, T, H * D)` (no copy between kernels), and
    the outputs match the float64 reference (interpret_heads.py)."""
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, str(HERE / "interpret_heads.py")], capture_output=True, text=True,
                          timeout=600, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == {"llama_gqa_bf16", "gpt2_f32"}
    for name, r in report.items():
        assert r["attention"] == 1 and r["strided"] == 1, (name, r)
        assert r["rel_err"] < (3e-2 if "bf16" in name else 1e-5), (name, r)


@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_engine_cross_compiles_for_h100(name: str, tmp_path) -> None:
    model, inputs, dyn = make(name)
    engine = xg.compile(model, inputs, target="H100", tune="predict", dynamic_shapes=dyn)
    kernels = engine.manifest["kernels"]
    assert kernels and all(v["arch"] == 90 for k in kernels for v in k["variants"])
    assert {k["kind"] for k in kernels} >= {"matmul", "rowwise" if name == "gpt" else "elementwise"} | \
        ({"attention"} if name == "gpt" else set())
    path = tmp_path / f"{name}.xge"
    engine.save(path)
    proc = subprocess.run([str(Path(sys.executable).with_name("xgrun")), str(path), "--seed", "1", "--dim", "batch=3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["gpt", "vit", "bert"])
def test_transformer_attention_is_one_fused_kernel_per_layer(name: str) -> None:
    # scaled_dot_product_attention (causal, a [B, 1, 1, S] boolean mask, or none) imports as naive
    # attention; the schedule fuses each layer's into one flash-style kernel.
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import kernel_specs
    from xgbuild.compiler.codegen.triton_attention import causal
    from xgbuild.compiler.importers.torch_export import import_torch
    model, inputs, dyn = make(name)
    s = schedule(import_torch(model, inputs, dynamic_shapes=dyn).optimized.main)
    specs = [spec for spec, _b in kernel_specs(s) if spec.kind == "attention"]
    layers = {"gpt": "blocks", "vit": "encoder", "bert": "layers"}[name]
    assert len(specs) == len(getattr(model, layers)) == 2
    assert all(causal(spec) == (name == "gpt") for spec in specs)
