"""Triton's interpreter made to compute as a GPU does (`runtime/interpret.py`), run in a fresh
process (`interpret_numerics.py`): float32 to bfloat16 rounds to nearest even, bit for bit as
torch (Triton 3.6's interpreter truncates, twice the error: the CPU tests' bfloat16 programs looked
about twice as far from float64 as they are on a GPU), and a bfloat16 product is exact products
summed in float32."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interpreted import interpreted_report  # noqa: E402


def test_the_interpreter_rounds_and_multiplies_as_a_gpu() -> None:
    report = interpreted_report("interpret_numerics.py")
    assert report["narrow_equal"] == 1.0 and report["nan_kept"], report
    assert report["dot_err"] < 1e-6, report
