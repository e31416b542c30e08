"""An RMSNorm after a product, as Llama writes it (a widening cast of the residual stream for the
reduction and another for the product with its row statistic): one row kernel, not a row kernel
writing the statistic and an element-wise kernel reading it and the row again; likewise a
cross-entropy's row max and its sum of exp(x - max). Checked under Triton's interpreter against
float64 with the row in one tile and in column tiles."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402


def test_rms_norm_after_a_product_is_one_row_kernel_and_matches_float64() -> None:
    report = interpreted_report(HERE / "interpret_row_epilogue.py")
    assert report["kinds"] == ["matmul", "rowwise"], report["kinds"]
    assert report["casts"] == 2                     # fork-casts' two casts: both in the row kernel
    for name, tile in (("whole", 1), ("tiles", 0)):
        run = report[name]
        assert [c["SINGLE"] for c in run["launched"]] == [tile]
        for out, eager in zip(run["outputs"], report["eager"]):
            # bfloat16 values: within a few times PyTorch eager's own error in the same dtypes
            assert out["rel_err"] < max(3 * eager, 1e-2), (name, out, eager)
    # Cross-entropy over bf16 logits: the row max, the sum of exp(x - max) and the target's logit in
    # one row kernel (test_row_passes: one walk along the row), the mean over rows in a second,
    # exact to float64's rounding
    assert report["ce_kinds"].count("rowwise") == 2
    for name in ("ce_whole", "ce_tiles"):
        (loss,) = report[name]
        assert loss["rel_err"] < 1e-6, (name, loss)
