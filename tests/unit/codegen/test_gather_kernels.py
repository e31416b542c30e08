"""`gather` (embedding lookups) on the GPU path, checked on a CPU: its kernels under Triton's
interpreter against the float64 reference (symbolic token counts, 1-D to 3-D indices, bf16 tables,
a strided table, indices from another kernel, replayed launches), an out-of-range index masked to
zeros, the schedule and tuning problem it makes, and a cross-compile for sm_90."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interpret_gather import CASES, case
from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.ir.graph import Op
from xgbuild.hw import load_profile
from xgbuild.runtime.cuda import cubin_arch
from xgbuild.tuner.jobs import plan
from xgbuild.tuner.link import build_kernels

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TOL = {"float32": 1e-6, "bfloat16": 0.0}      # a gather copies; float32 adds round once


def run_script(script: str, arg: str):
    """The last line of `script` (beside this file, run in a fresh process so that it can turn
    Triton's interpreter on before importing it) as JSON."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(HERE / script), arg], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _interpret(arg: str):
    return run_script("interpret_gather.py", arg)


@pytest.mark.parametrize("name", CASES)
def test_gather_kernels_match_float64_reference(name: str) -> None:
    report = _interpret(name)
    assert len(report) == 3 * len(case(name)[0].output["tuple"])
    # Indices are tensor data the kernel reads: later runs replay the first one's launches.
    assert any(out["replayed"] for out in report)
    for out in report:
        assert out["rel_err"] <= TOL[out["dtype"]], out


def test_out_of_range_index_reads_zeros_not_out_of_bounds() -> None:
    assert _interpret("out_of_range") == {"equal": True}


def test_computed_indices_out_of_range_are_an_error_in_check_mode() -> None:
    report = _interpret("computed_out_of_range")
    for label in ("first", "replayed"):
        assert "index 41 is out of bounds for a table of 41 rows" in report[label], report
        assert "computed by the program" in report[label]
    assert report["unchecked"] == "ran"


def test_gather_starts_a_kernel_that_consumers_join_but_a_row_kernel_does_not_absorb() -> None:
    graph, _, _ = case("embed_add")
    s = schedule(graph)
    assert [k.kind for k in s.kernels] == ["elementwise"]
    assert [graph.node(i).op for i in s.kernels[0].nodes] == [Op.GATHER, Op.CAST, Op.ADD]
    graph, _, _ = case("strided")
    s = schedule(graph)
    # `idx + 1` is its own kernel of the indices' shape; the gather reads it and the MUL joins.
    assert [[graph.node(i).op for i in k.nodes] for k in s.kernels] == [[Op.ADD], [Op.GATHER, Op.MUL]]


@pytest.mark.parametrize("B, T", [(1, 16), (4, 1024)])
def test_gather_is_priced_as_memory_traffic_not_as_a_matmul(B: int, T: int) -> None:
    graph, _, vocab = case("embed_add")
    (job,), _ = plan(graph, {"B": B, "T": T})
    tokens, d = B * T, 24
    p = job.problem
    assert p.kind == "elementwise" and p.numel == tokens * d
    # bf16 table rows, one per token (at most the whole table), int64 indices, the float32 position
    # rows and the float32 output; a few operations per element, no vocab x d products.
    assert p.bytes == min(tokens, vocab) * d * 2 + tokens * 8 + T * d * 4 + tokens * d * 4
    assert p.flops <= 3 * tokens * d


def test_gather_kernels_cross_compile_for_sm90() -> None:
    graph, _, _ = case("shapes")
    table = build_kernels(graph, load_profile("H100"), policy="predict", dims={"B": 2, "T": 64})
    cubins = [data for path, data in table.files.items() if path.endswith(".cubin")]
    assert len(table.kernels) == 3 and cubins and all(cubin_arch(c) == 90 for c in cubins)
