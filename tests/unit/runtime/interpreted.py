"""Runs an interpreter script (`interpret_*.py`, this folder's or another's) in a fresh process with
TRITON_INTERPRET=1 (Triton reads it once, at import) and returns the JSON report it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def interpreted_report(script: str | Path) -> dict:
    """`script`: a name in this folder, or the path of another folder's script."""
    path = HERE / script
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(path.parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
