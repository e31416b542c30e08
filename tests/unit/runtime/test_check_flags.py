"""Check mode with the kernels' own NaN/Inf flags (issue 21): the kernels that store the engine's
outputs raise one flag word, read once after the run, instead of a scan of every output; a raised
flag still ends in the CPU reference's trace naming the op that made the NaN and its line. Run under
Triton's interpreter, so the generated code itself is what is tested."""

from __future__ import annotations

from interpreted import interpreted_report


def test_kernel_flags_name_the_op_and_line_that_made_the_nan() -> None:
    report = interpreted_report("interpret_check.py")
    assert report["covered"] == 2                       # both outputs stored by kernels: no scan
    for label in ("first", "replayed"):
        assert report[f"{label}_clean_flag"] == 0, report       # the discarded side of `where` never trips it
        assert report[f"{label}_flag"] == 1, report
        message = report[label]
        assert "NaN" in message and "`log`" in message and "line 4" in message, message
    assert report["unchecked_flags"] is None            # checks off: no word allocated, none read
