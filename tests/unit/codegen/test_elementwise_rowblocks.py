"""The element-wise kernel's row blocks (`ROWBLOCK`) under Triton's interpreter
(`interpret_rowblocks.py`): broadcasts along either dim, transposed and sliced operands, an
unindex, 2 and 3 dims, partial last blocks; row tiles (`COLS`) of short rows (attention's head
gradients placed into [B, T, 3, H, DH]); the check-mode flag; and the space, grid and variant
rules that keep row blocks to domains whose last dim is long and tiles to short ones."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402

from xgbuild.compiler.codegen.launch_abi import Launch, Variant  # noqa: E402
from xgbuild.compiler.codegen.templates.base import Problem  # noqa: E402
from xgbuild.compiler.codegen.templates.elementwise import ROWBLOCK_MIN, TEMPLATE  # noqa: E402
from xgbuild.hw import load_profile  # noqa: E402


@pytest.fixture(scope="module")
def report() -> dict:
    return interpreted_report(HERE / "interpret_rowblocks.py")


@pytest.mark.parametrize("case", ["broadcasts", "three_dims", "unindex", "heads", "short_rows"])
@pytest.mark.parametrize("config", [0, 1, 2, 3])
def test_row_blocks_match_float64(report, case, config):
    got = report[f"{case} {config}"]
    assert got["rowblocks"] >= 1, got
    if config >= 2:                     # row tiles forced (COLS): several rows a program, or a
        assert got["tiles"] >= 1, got   # row in two tiles
    assert all(err < 1e-5 for err in got["errors"]), got
    assert got["flag"] == 1, got        # a NaN in the last row's last block raises the flag


def test_space_grid_and_variants():
    hw = load_profile("H100")
    long = Problem("elementwise", "float32", 1.0, 1e6, numel=8192 * 50304, cols=50304, elem_bytes=4)
    short = Problem("elementwise", "float32", 1.0, 1e6, numel=8192 * 64, cols=0, elem_bytes=4)
    assert any(c.get("ROWBLOCK") for c in TEMPLATE.full_space(long, hw))
    assert not any(c.get("ROWBLOCK") for c in TEMPLATE.full_space(short, hw))
    narrow = Problem("elementwise", "float32", 1.0, 1e6, numel=8 * 600, cols=600, elem_bytes=4)
    kept = [c for c in TEMPLATE.full_space(narrow, hw) if c.get("ROWBLOCK")
            and all(rule(narrow, c, hw) is None for rule in TEMPLATE.rules)]
    assert kept and max(c["BLOCK"] for c in kept) == 1024       # next_pow2(600)
    cfg = {"BLOCK": 1024, "num_warps": 4, "num_stages": 1, "ROWBLOCK": 1}
    assert TEMPLATE.grid(cfg, {"numel": 7 * 2500, "L": 2500}) == (21, 1, 1)     # 3 blocks a row
    assert TEMPLATE.grid(cfg, {"numel": 0, "L": 0}) == (0, 1, 1)
    # A launch without a long last dim (no L) runs another variant.
    assert not TEMPLATE.accepts(Variant.generic(), cfg, Launch({}, {"numel": 64 * 8}, []))
    assert TEMPLATE.accepts(Variant.generic(), cfg, Launch({}, {"numel": 600 * 8, "L": 600}, []))
    assert ROWBLOCK_MIN == 512


def test_row_tiles_space_grid_and_rules():
    """Rows shorter than a block (a head's 64) are offered as tiles of BLOCK // COLS rows, COLS the
    smallest power of two covering a row; the rules keep COLS a power of two dividing BLOCK."""
    hw = load_profile("H100")
    heads = Problem("elementwise", "bfloat16", 1.0, 1e6, numel=8 * 1024 * 3 * 12 * 64, cols=64, elem_bytes=2)
    tiles = [c for c in TEMPLATE.full_space(heads, hw) if c.get("COLS")]
    assert tiles and {c["COLS"] for c in tiles} == {64} and all(c["ROWBLOCK"] == 1 for c in tiles)
    assert all(all(rule(heads, c, hw) is None for rule in TEMPLATE.rules) for c in tiles)
    odd = Problem("elementwise", "float32", 1.0, 1e6, numel=37 * 20, cols=20, elem_bytes=4)
    assert {c["COLS"] for c in TEMPLATE.full_space(odd, hw) if c.get("COLS")} == {32}
    # Too short for tiles, or long enough for row blocks: no COLS offered.
    for cols in (8, 600):
        p = Problem("elementwise", "float32", 1.0, 1e6, numel=64 * cols, cols=cols, elem_bytes=4)
        assert not any(c.get("COLS") for c in TEMPLATE.full_space(p, hw))
    base = {"BLOCK": 256, "num_warps": 4, "num_stages": 1, "ROWBLOCK": 1}
    rule = next(r for r in TEMPLATE.rules if r.__name__ == "_row_block")
    assert rule(odd, {**base, "COLS": 32}, hw) is None
    assert "power of two" in rule(odd, {**base, "COLS": 24}, hw)
    assert "power of two" in rule(odd, {**base, "COLS": 512}, hw)
    assert "last dim" in rule(odd, {**base, "COLS": 64}, hw)             # wider than the row needs
    assert "ROWBLOCK" in rule(odd, {"BLOCK": 256, "num_warps": 4, "num_stages": 1, "COLS": 32}, hw)
    # 37 rows of 20 in tiles of 8 rows: 5 programs; a row of 20 in tiles of 16 columns: 2 a row.
    assert TEMPLATE.grid({**base, "COLS": 32}, {"numel": 37 * 20, "L": 20}) == (5, 1, 1)
    assert TEMPLATE.grid({**base, "COLS": 16}, {"numel": 37 * 20, "L": 20}) == (2 * 3, 1, 1)
    assert TEMPLATE.grid({**base, "COLS": 32}, {"numel": 0, "L": 20}) == (0, 1, 1)
    # Tiles need the launch's L; plain row blocks still need a row of ROWBLOCK_MIN.
    assert TEMPLATE.accepts(Variant.generic(), {**base, "COLS": 32}, Launch({}, {"numel": 740, "L": 20}, []))
    assert not TEMPLATE.accepts(Variant.generic(), {**base, "COLS": 32}, Launch({}, {"numel": 740}, []))
    assert not TEMPLATE.accepts(Variant.generic(), base, Launch({}, {"numel": 740, "L": 20}, []))
