"""The kernels' division by a run-time size (`_udiv`, with the launch's `div_magic`) compiled for
this GPU: umulhi and the unsigned shift as the hardware does them. Every quotient must be exact
(same dividends as the interpreter's test, `tests/unit/codegen/interpret_magic.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "codegen"))
from interpret_magic import DIVISORS, report  # noqa: E402


def test_every_quotient_is_exact_on_the_gpu():
    got = report("cuda")
    assert set(got) == {str(d) for d in DIVISORS}
    assert all(r["n"] > 250 and r["wrong"] == 0 for r in got.values()), got
