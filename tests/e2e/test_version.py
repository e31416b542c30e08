"""`--version` on every command (issue 25, finding 3): XG's version, Triton's, torch's, and the
CUDA driver's when one loads ("no CUDA driver" otherwise)."""

from __future__ import annotations

import importlib.metadata
from types import SimpleNamespace

import pytest

import xgbuild
from xgbuild.runtime import cuda as cuda_runtime

from conftest import cli

PROGS = ("xgc", "xgrun", "xgbuild")


@pytest.mark.parametrize("prog", PROGS)
def test_version_names_xg_triton_torch_and_the_driver(prog: str) -> None:
    res = cli(prog, "--version")     # xgc's FILE and xgrun's ENGINE are required: the eager option answers first
    assert res.code == 0 and not res.err, res.both
    lines = res.out.splitlines()
    assert lines[0] == f"{prog} (XG) {xgbuild.__version__}"
    assert f"triton {importlib.metadata.version('triton')}" in lines
    assert f"torch {importlib.metadata.version('torch')}" in lines
    driver = cuda_runtime.driver_version()
    assert any(line.startswith(f"CUDA driver {driver} (" if driver else "no CUDA driver (") for line in lines), res.out


def test_a_driver_that_loads_is_named_by_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_runtime, "driver_module", lambda: SimpleNamespace(cuDriverGetVersion=lambda: (0, 12080)))
    assert cuda_runtime.driver_version() == "12.8"
    assert "CUDA driver 12.8 (cuda-bindings " in cli("xgc", "--version").out


def test_no_driver_is_said_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing():
        raise cuda_runtime.CudaRuntimeError("cuda-python is not installed")
    monkeypatch.setattr(cuda_runtime, "driver_module", missing)
    assert cuda_runtime.driver_version() is None
    assert "no CUDA driver (cuda-bindings " in cli("xgrun", "--version").out
