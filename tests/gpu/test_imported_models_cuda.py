"""Imported models on a real GPU: the five example models through `xg.compile` and through an ONNX
export, built for this GPU's profile, called with CUDA tensors, against float64 eager on the CPU;
an engine saved by xg.compile runs in `xgrun --device cuda`.

The reference runs on the CPU: on an H100, PyTorch's own CUDA runs of the ViT model (float64 and
float32 alike) differ from its CPU float64 result by 2.4e-4 relative, while XG's CUDA engine matches
the CPU result at 3.6e-7 (tools/diag/gpu_nodes.py vit), so a CUDA float64 reference is not exact.
"""

from __future__ import annotations

import contextlib
import copy
import io
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from gpu_target import local_target

import xg

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
from torch_models import NAMES, make  # noqa: E402

TOL = 1e-4


def as_tuple(v) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def check(engine, name: str, model, batch: int, seed: int) -> None:
    host = make(name, batch=batch, seed=seed)[1]
    got = as_tuple(engine(*(x.cuda() for x in host)))
    ref_model = copy.deepcopy(model).double().cpu()
    with torch.no_grad():
        refs = as_tuple(ref_model(*[x.double() if x.is_floating_point() else x for x in host]))
    for g, r in zip(got, refs):
        assert g.is_cuda
        err = ((g.double().cpu() - r).norm() / r.norm()).item()
        assert err < TOL, f"relative error {err:.3g}"


@pytest.mark.parametrize("name", NAMES)
def test_xg_compile_on_cuda(name: str) -> None:
    model, inputs, dyn = make(name)
    engine = xg.compile(model, inputs, target=local_target(), tune="predict", dynamic_shapes=dyn)
    check(engine, name, model, batch=2, seed=11)
    check(engine, name, model, batch=7, seed=12)          # another size: the generic kernel variants


@pytest.mark.parametrize("name", NAMES)
def test_onnx_on_cuda(name: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    from xgbuild.build.engines import model_engine
    from xgbuild.build.target import target_profile
    from xgbuild.compiler.importers.onnx_import import import_onnx
    from xgbuild.runtime.model_engine import ModelEngine
    from xgbuild.settings import Settings
    model, inputs, dyn = make(name)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dyn)
    engine = ModelEngine(model_engine(import_onnx(path, target=local_target()), target_profile(local_target()),
                                      Settings.from_env(), policy="predict"))
    check(engine, name, model, batch=2, seed=13)


def test_saved_engine_runs_in_xgrun_on_cuda(tmp_path: Path) -> None:
    model, inputs, dyn = make("gpt")
    engine = xg.compile(model, inputs, target=local_target(), tune="predict", dynamic_shapes=dyn)
    engine.save(tmp_path / "gpt.xge")
    xgrun = Path(sys.executable).with_name("xgrun")
    cmd = [str(xgrun)] if xgrun.exists() else [sys.executable, "-m", "xgbuild.cli.xgrun"]
    proc = subprocess.run([*cmd, str(tmp_path / "gpt.xge"), "--device", "cuda", "--seed", "1", "--dim", "batch=4"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "[4, 16, 64]" in proc.stdout
