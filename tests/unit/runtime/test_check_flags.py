"""Check mode with the kernels' own NaN/Inf flags (issue 21): the kernels that store the engine's
outputs raise one flag word, read once after the run, instead of a scan of every output; a raised
flag still ends in the CPU reference's trace naming the op that made the NaN and its line. Run under
Triton's interpreter, so the generated code itself is what is tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def test_kernel_flags_name_the_op_and_line_that_made_the_nan() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(HERE / "interpret_check.py")], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["covered"] == 2                       # both outputs stored by kernels: no scan
    for label in ("first", "replayed"):
        assert report[f"{label}_clean_flag"] == 0, report       # the discarded side of `where` never trips it
        assert report[f"{label}_flag"] == 1, report
        message = report[label]
        assert "NaN" in message and "`log`" in message and "line 4" in message, message
    assert report["unchecked_flags"] is None            # checks off: no word allocated, none read
