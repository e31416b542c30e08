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


def test_shape_only_gather_indices_are_checked_once_input_ones_every_run() -> None:
    """A convolution's im2col indices follow from the shapes alone: the first checked run of a graph
    finds them in range and later runs skip the reduction (and, in a CUDA graph, the sync it needs).
    Indices computed from an input are checked on every run, replayed or not."""
    report = interpreted_report("interpret_gather_checks.py")
    assert report["gpu_module_aminmax_patched"]
    assert [r["checked"] for r in report["conv"]] == [1, 0, 0], report
    assert not any("error" in r for r in report["conv"])
    lookup = report["lookup"]
    assert [r["checked"] for r in lookup] == [1, 1, 1], report
    assert "error" not in lookup[0] and "error" not in lookup[2]
    assert "index 11 is out of bounds for a table of 10 rows" in lookup[1]["error"]
