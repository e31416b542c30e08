"""Persistent matmuls (one program per SM walking the tiles, operands through tensor descriptors)
under Triton's interpreter: every layout the descriptors take (A or B stored transposed), batched,
partial tiles, an epilogue; in check mode the flattened tile loop still raises the NaN flag (from
the per-row sums it carries) and without check mode it raises none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402


@pytest.fixture(scope="module")
def report() -> dict:
    return interpreted_report(HERE / "interpret_persistent.py")


@pytest.mark.parametrize("case", ["linear", "plain", "a_transposed", "batched"])
@pytest.mark.parametrize("tma", [1, 0])
def test_persistent_matmul_matches_float64(report, case, tma):
    got = report[f"{case} tma={tma}"]
    assert got["variants"] == ["tuned"]               # the persistent kernel ran, not the generic one
    assert got["descriptors"] == bool(tma)
    assert all(err < 1e-5 for err in got["errors"]), got


@pytest.mark.parametrize("tma", [1, 0])
def test_persistent_matmul_raises_the_nan_flag_in_check_mode_only(report, tma):
    assert report[f"linear tma={tma}"]["flags"] == {"clean": 0, "nan": 1, "unchecked": 0}
