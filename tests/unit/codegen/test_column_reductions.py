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


def _tolerances(case: str, n: int) -> list[float]:
    if case == "bf16cast":          # the float32 sums, then the bfloat16 cast (its rounding)
        return [1e-6, 1e-2]
    # "short" and "lngrad": bfloat16 inputs, float32 sums
    return [1e-2 if case.startswith("bf16") else 1e-6] * n


@pytest.mark.parametrize("case", ["bias", "split", "three", "transposed", "bf16", "bf16t", "short", "lngrad",
                                  "bf16cast"])
@pytest.mark.parametrize("config", [0, 1, 2])
def test_column_form_matches_float64(report, case, config):
    got = report[f"{case} {config}"]
    # Every row reduction ran in the column form at the forced config, none in the one-row form.
    assert got["rowwise"] and all(rows == CONFIGS[config]["ROWS"] for rows in got["rowwise"]), got
    assert all(err < tol for err, tol in zip(got["errors"], _tolerances(case, len(got["errors"])), strict=True)), got


@pytest.mark.parametrize("form", ["looped", "single"])
def test_a_first_stage_writing_a_cast_matches_float64_in_the_one_row_forms(report, form):
    got = report[f"bf16cast {form}"]
    assert got["rowwise"] == [0, 0], got
    assert all(err < tol for err, tol in zip(got["errors"], _tolerances("bf16cast", 2), strict=True)), got


def test_the_bias_gradients_first_stage_writes_the_cast_of_what_it_sums():
    """The tanh GELU's gradient, summed over the tokens and cast to bfloat16, is no kernel of its
    own: the first stage computes it over [T / 64, 64, D] and writes the cast there, the sums
    beside it; the float32 gradient is never written."""
    from interpret_columns import CASES
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_source
    g = compile_source(CASES["bf16cast"][0]).optimized.main
    sched = schedule(g)
    assert [(k.kind, tuple(k.shape)) for k in sched.kernels] == [("rowwise", (16, 64, 40)), ("rowwise", (16, 40))]
    first = sched.kernels[0]
    assert sorted((g.node(o).dtype, tuple(g.node(o).shape)) for o in sched.outputs(first)) == \
        [("bfloat16", (16, 64, 40)), ("float32", (16, 40))]
    assert sorted(g.node(i).dtype for i in sched.inputs(first)) == ["bfloat16", "bfloat16", "float32"]


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
