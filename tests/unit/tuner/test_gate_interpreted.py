"""Every job of cross-entropy's programs passes the tuner's correctness gate with its real kernel,
run under Triton's interpreter on the job's own seeded inputs (`interpret_gate.py`): the kernels
compute values the float64 reference takes from outside them (a column arange, a padding's mask,
a row value read through a reshape), and the reference must compute the same."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402


def test_cross_entropys_jobs_pass_the_gate_under_the_interpreter() -> None:
    report = interpreted_report(HERE / "interpret_gate.py")
    assert len(report["cross_entropy"]) >= 2 and len(report["padded_head"]) >= 8, report
    # the padded head's loss gradient computes its arange and mask from the column index
    assert any("iota" in j["ops"] and "lt" in j["ops"] for j in report["padded_head"]), report
    for program, jobs in report.items():
        for job in jobs:
            assert job["why"] is None, (program, job)
