"""The element-wise kernel's row blocks (`ROWBLOCK`) under Triton's interpreter
(`interpret_rowblocks.py`): broadcasts along either dim, transposed and sliced operands, an
unindex, 2 and 3 dims, partial last blocks; the check-mode flag; and the space, grid and variant
rules that keep row blocks to domains whose last dim is long."""

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


@pytest.mark.parametrize("case", ["broadcasts", "three_dims", "unindex"])
@pytest.mark.parametrize("config", [0, 1])
def test_row_blocks_match_float64(report, case, config):
    got = report[f"{case} {config}"]
    assert got["rowblocks"] >= 1, got
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
