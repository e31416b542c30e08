"""The row-reduction kernel's column form compiled for this GPU: the interpreter's cases
(`tests/unit/codegen/interpret_columns.py`: bias gradients, split first stages, transposed and
bfloat16 operands, short rows, LayerNorm's gradients sharing a kernel, the MLP's bias gradient
writing the bfloat16 cast of what it sums through its strides) at each forced config, against
the float64 reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "codegen"))
from interpret_columns import CASES, CONFIGS, ONE_ROW, report  # noqa: E402


def test_column_form_on_the_gpu():
    got = report("cuda")
    assert len(got) == len(CASES) * len(CONFIGS) + len(ONE_ROW)
    for key, r in got.items():
        name, forced = key.split()
        assert r["rowwise"], (key, r)
        if forced.isdigit():
            assert all(rows == CONFIGS[int(forced)]["ROWS"] for rows in r["rowwise"]), (key, r)
        tols = [1e-6, 1e-2] if name == "bf16cast" else [1e-2 if name.startswith("bf16") else 1e-5] * len(r["errors"])
        assert all(err < tol for err, tol in zip(r["errors"], tols, strict=True)), (key, r)
