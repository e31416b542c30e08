"""The row-reduction kernel's column form under Triton's interpreter (`interpret_columns.py`):
rows taken along the last kept dim, the other kept dims one index a program, partial blocks of
rows masked; every column job at several tiles matches float64. Short rows reduced along the last
dim take the same form (many rows a program)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
sys.path.insert(0, str(HERE))
from interpreted import interpreted_report  # noqa: E402

from interpret_columns import CONFIGS  # noqa: E402

from xgbuild.compiler.codegen.templates.rowwise import TEMPLATE  # noqa: E402


@pytest.fixture(scope="module")
def report() -> dict:
    return interpreted_report(HERE / "interpret_columns.py")


@pytest.mark.parametrize("case", ["bias", "split", "three", "transposed", "bf16", "bf16t", "short", "lngrad"])
@pytest.mark.parametrize("config", [0, 1, 2])
def test_column_form_matches_float64(report, case, config):
    got = report[f"{case} {config}"]
    # Every row reduction ran in the column form at the forced config, none in the one-row form.
    assert got["rowwise"] and all(rows == CONFIGS[config]["ROWS"] for rows in got["rowwise"]), got
    # "short" and "lngrad": bfloat16 inputs, float32 sums
    tol = 1e-2 if case.startswith("bf16") else 1e-6
    assert all(err < tol for err in got["errors"]), got


@pytest.mark.parametrize("case", ["bf16", "bf16t"])
def test_a_widened_input_is_one_column_kernel_loading_bfloat16(case):
    from interpret_columns import CASES
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_source
    g = compile_source(CASES[case][0]).optimized.main
    sched = schedule(g)
    assert [k.kind for k in sched.kernels] == ["rowwise"]
    assert [g.node(i).dtype for i in sched.inputs(sched.kernels[0])] == ["bfloat16"]


def test_column_grid_covers_each_outer_index_in_blocks_of_rows():
    cfg = {"BLOCK_N": 16, "ROWS": 32, "SINGLE": 0}
    # 5 outer indices x a last kept dim of 37: two blocks of 32 rows each.
    assert TEMPLATE.grid(cfg, {"R": 5 * 37, "C": 24, "L": 37}) == (10, 1, 1)
    assert TEMPLATE.grid(cfg, {"R": 0, "C": 24, "L": 0}) == (0, 1, 1)
    assert TEMPLATE.grid({"BLOCK_N": 64, "SINGLE": 0}, {"R": 7, "C": 100}) == (7, 1, 1)


def test_short_rows_get_the_column_form_and_long_ones_do_not():
    from xgbuild.compiler.codegen.templates.base import Problem
    from xgbuild.hw import load_profile
    hw = load_profile("H100")
    from interpret_columns import CASES
    from xgbuild.compiler.driver import compile_source
    from xgbuild.tuner.jobs import plan, tuning_env
    g = compile_source(CASES["short"][0]).optimized.main
    jobs, _ = plan(g, tuning_env(g, {}))
    (job,) = [j for j in jobs if j.spec.kind == "rowwise"]
    assert job.problem.short_rows and not job.problem.columns
    assert any(c.get("ROWS") for c in TEMPLATE.full_space(job.problem, hw))
    long = Problem("rowwise", "float32", 1.0, 1.0, rows=64, cols=4096)
    assert not any(c.get("ROWS") for c in TEMPLATE.full_space(long, hw))
