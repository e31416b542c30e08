"""The element-wise kernel's row blocks and row tiles (`ROWBLOCK`, `COLS`) compiled for this GPU:
the interpreter's cases (`tests/unit/codegen/interpret_rowblocks.py`: broadcasts, transposed and
sliced operands, attention's head gradients placed into a fused [B, T, 3, H, DH] tensor, rows
shorter than a tile) at each forced config, against the float64 reference, with the check-mode
flag raised by a NaN in the last row's last block."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "codegen"))
from interpret_rowblocks import CASES, CONFIGS, TILES, report  # noqa: E402


def test_row_blocks_and_tiles_on_the_gpu():
    got = report("cuda")
    assert len(got) == len(CASES) * (len(CONFIGS) + len(TILES))
    for key, r in got.items():
        assert r["rowblocks"] >= 1, (key, r)
        if int(key.split()[-1]) >= len(CONFIGS):
            assert r["tiles"] >= 1, (key, r)
        assert all(err < 1e-5 for err in r["errors"]), (key, r)
        assert r["flag"] == 1, (key, r)
