"""The build-system steps on a real GPU: `xgbuild jobs` -> `xgbuild tune-shard --tune=measure` (what
a Bazel measuring action runs) -> `xgc --kernels-from`, then the linked engine on the GPU against
the float64 CPU reference; a second tune-shard is all cache hits and gives the same result bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xgbuild.runtime.engine import Engine
from xgbuild.runtime.tensor_io import random_inputs

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def _target() -> str:
    name = torch.cuda.get_device_name(0)
    for target in ("H200", "H100"):
        if target in name:
            return target
    pytest.skip(f"measuring needs a GPU with a hw/ profile; this is {name}")


def _run(*args: str, env=None) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=900, cwd=REPO,
                         env=env)
    assert res.returncode == 0, res.stderr
    return res


def test_measured_shards_link_into_an_engine_that_matches_the_reference(tmp_path):
    import os
    target = _target()
    env = dict(os.environ, XG_CACHE_DIR=str(tmp_path / "xg-cache"))
    src = str(REPO / "examples" / "mlp.xg")
    dims = {"T": 512, "D": 256, "F": 512}
    dim_args = [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]
    shards = [tmp_path / f"shard-{i}.json" for i in range(2)]
    _run("xgbuild.cli.xgbuild", "jobs", src, "--target", target, *dim_args,
         *[a for s in shards for a in ("--out", str(s))], env=env)
    results = []
    for s in shards:
        r = tmp_path / (s.stem + ".result.json")
        _run("xgbuild.cli.xgbuild", "tune-shard", str(s), "--tune", "measure", "--budget", "2", "--out", str(r),
             env=env)
        results.append(r)
    sources = {k["tuning"]["source"] for r in results for k in json.loads(r.read_text())["kernels"].values()}
    assert sources == {"measured"}
    on = {k["tuning"]["measured_on"] for r in results for k in json.loads(r.read_text())["kernels"].values()}
    assert all(target in name for name in on), on
    # The winners are in the cache now: tuning again measures nothing.
    again = tmp_path / "again.json"
    res = _run("xgbuild.cli.xgbuild", "tune-shard", str(shards[0]), "--tune", "cache", "--out", str(again),
               env=env)
    assert "0 measured" in res.stderr
    out = tmp_path / "mlp.xge"
    _run("xgbuild.cli.xgc", src, "--target", target, *dim_args, "--out", str(out),
         *[a for r in results for a in ("--kernels-from", str(r))], env=env)
    engine = Engine.load(out)
    assert {k["tuning"]["source"] for k in engine.manifest["kernels"]} == {"measured"}
    sig = {s["name"]: (s["dtype"], tuple(dims.get(d, d) for d in s["shape"])) for s in engine.signature}
    inputs = random_inputs(sig, seed=5)
    ref = engine.run(inputs, device="cpu", float64=True)
    got = engine.run({k: v.cuda() for k, v in inputs.items()}, device="cuda")
    for name, r in ref.tensors.items():
        g = got.tensors[name].cpu().double()
        err = (g - r.double()).norm() / r.double().norm()
        assert err < 3e-2, (name, float(err))
