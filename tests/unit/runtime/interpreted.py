"""Runs one of this folder's interpreter scripts (`interpret_*.py`) in a fresh process with
TRITON_INTERPRET=1 (Triton reads it once, at import) and returns the JSON report it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def interpreted_report(script: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
