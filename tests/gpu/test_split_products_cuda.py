"""passes/split_products.py's forms compiled for this GPU: the interpreter's program
(`tests/unit/passes/split_products_cases.py`: a tail split by rows and by columns, products split
whole, with transposed operands) against the float64 reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "passes"))
from interpret_split_products import report  # noqa: E402


def test_split_products_on_the_gpu():
    got = report("cuda")
    assert got["widened"] == 4
    # bfloat16 results (the whole product's rounding: 3.3e-3 under the interpreter) and a float32 one.
    assert all(err < 7e-3 for err in got["errors"]), got
