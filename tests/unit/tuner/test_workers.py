"""Compile workers are plain subprocesses: a script that compiles at top level (no `__main__` guard)
works, results and exceptions come back, a worker that dies fails only its job and is replaced."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xgbuild.tuner.workers import SubprocessPool, WorkerDied

ROOT = Path(__file__).resolve().parents[3]


def test_results_and_exceptions_come_back() -> None:
    pool = SubprocessPool(2)
    try:
        squares = [pool.submit(pow, i, 2) for i in range(6)]
        assert [f.result(timeout=60) for f in squares] == [i * i for i in range(6)]
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result(timeout=60)
    finally:
        pool.shutdown()


def test_a_dead_worker_fails_its_job_and_is_replaced() -> None:
    pool = SubprocessPool(1)
    try:
        with pytest.raises(WorkerDied, match="exited with code 3"):
            pool.submit(os._exit, 3).result(timeout=60)
        assert pool.submit(max, 4, 9).result(timeout=60) == 9
    finally:
        pool.shutdown()


def test_submit_after_shutdown_is_refused() -> None:
    pool = SubprocessPool(1)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(max, 1, 2)


def test_compile_at_top_level_of_a_script(tmp_path: Path) -> None:
    """multiprocessing's spawn would re-run this script in every worker and crash it (workers: one per core)."""
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(f"""
        import xg
        engine = xg.compile_file({str(ROOT / "examples" / "mlp.xg")!r}, target="H100", tune="predict")
        print("kernels", len(engine.manifest["kernels"]))
    """))
    env = {**os.environ, "XG_CACHE_DIR": str(tmp_path / "cache")}     # empty: every kernel compiles
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kernels" in proc.stdout and "bootstrapping" not in proc.stderr
