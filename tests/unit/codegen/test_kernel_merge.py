"""Element-wise kernels of one shape merge when a node reads both (no third kernel between them):
rotary embeddings are one kernel per tensor (were four: the negated half, each placed half, the
sums), with the negation after the placement; a merge that would close a cycle through a matmul is
refused. Numbers under Triton's interpreter against the float64 reference, and on the CPU
executor against torch itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import xg

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from interpret_merge import Rotary, rotary_inputs  # noqa: E402


def test_rotary_embedding_is_one_kernel_per_tensor_and_a_cycle_is_never_merged() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(HERE / "interpret_merge.py")], capture_output=True, text=True,
                          env=env, timeout=600, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    rotary = report["rotary"]["kernels"]
    assert [k[0] for k in rotary] == ["elementwise", "elementwise"], rotary
    assert all({"neg", "unindex", "mul", "add"} <= set(k[2]) for k in rotary)
    cycle = report["cycle"]["kernels"]
    # x * 2 feeds the matmul whose padded product the sum reads: the sum joins the pad's kernel and
    # the product's producer stays a kernel of its own
    assert [k[0] for k in cycle] == ["elementwise", "matmul", "elementwise"], cycle
    for name in ("rotary", "cycle"):
        outs = report[name]["outputs"]
        assert outs and all(o["rel_err"] < 1e-6 for o in outs), (name, outs)


def test_rotary_embedding_matches_torch_on_the_cpu_executor() -> None:
    engine = xg.compile(Rotary(), rotary_inputs(0), target="H100", tune="predict", kernels=False)
    fresh = rotary_inputs(2)
    got = engine(*fresh)
    want = Rotary()(*(t.double() for t in fresh))
    for g, w in zip(got, want):
        assert float((g.double() - w).norm() / w.norm()) < 1e-6
