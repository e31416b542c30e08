"""Element-wise kernels of one shape merge when a node reads both (no third kernel between them):
rotary embeddings are one kernel per tensor (were four: the negated half, each placed half, the
sums), with the negation after the placement; a merge that would close a cycle through a matmul is
refused. Numbers under Triton's interpreter against the float64 reference, and on the CPU
executor against torch itself."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import xg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402
from interpret_merge import Rotary, rotary_inputs  # noqa: E402


def test_rotary_embedding_is_one_kernel_per_tensor_and_cycles_and_views_are_never_merged() -> None:
    report = interpreted_report(HERE / "interpret_merge.py")
    rotary = report["rotary"]["kernels"]
    assert [k[0] for k in rotary] == ["elementwise", "elementwise"], rotary
    assert all({"neg", "unindex", "mul", "add"} <= set(k[2]) for k in rotary)
    cycle = report["cycle"]["kernels"]
    # x * 2 feeds the matmul whose padded product the sum reads: the sum joins the pad's kernel and
    # the product's producer stays a kernel of its own
    assert [k[0] for k in cycle] == ["elementwise", "matmul", "elementwise"], cycle
    # a value read through a view (here transposed) comes from memory: its kernel stays apart
    assert [k[0] for k in report["viewed"]["kernels"]] == ["elementwise", "elementwise"], report["viewed"]
    for name in ("rotary", "cycle", "viewed"):
        outs = report[name]["outputs"]
        assert outs and all(o["rel_err"] < 1e-6 for o in outs), (name, outs)


def test_rotary_embedding_matches_torch_on_the_cpu_executor() -> None:
    engine = xg.compile(Rotary(), rotary_inputs(0), target="H100", tune="predict", kernels=False)
    fresh = rotary_inputs(2)
    got = engine(*fresh)
    want = Rotary()(*(t.double() for t in fresh))
    for g, w in zip(got, want):
        assert float((g.double() - w).norm() / w.norm()) < 1e-6
