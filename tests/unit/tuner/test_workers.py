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


def test_jobs_run_lowest_priority_first() -> None:
    import time
    pool = SubprocessPool(1)
    try:
        pool.submit(time.sleep, 1.0)                          # holds the one worker while the rest queue
        late = pool.submit_at(5, time.monotonic_ns)
        soon = pool.submit_at(1, time.monotonic_ns)
        same = [pool.submit_at(3, time.monotonic_ns) for _ in range(3)]
        order = [f.result(timeout=60) for f in (soon, *same, late)]
        assert order == sorted(order)                          # 1, then the 3s in submission order, then 5
    finally:
        pool.shutdown()


def test_shutdown_with_cancel_stops_running_and_queued_jobs() -> None:
    import time
    pool = SubprocessPool(1)
    running = pool.submit(time.sleep, 60)
    queued = pool.submit(time.sleep, 60)
    deadline = time.monotonic() + 60
    while not pool._live and time.monotonic() < deadline:    # the worker process exists and holds the first
        time.sleep(0.05)
    time.sleep(0.5)
    t0 = time.monotonic()
    pool.shutdown(wait=True, cancel_futures=True)
    assert time.monotonic() - t0 < 20
    assert queued.cancelled()
    with pytest.raises(WorkerDied):
        running.result(timeout=5)


def test_a_gpu_measuring_process_takes_jobs_and_reports_its_errors(tmp_path: Path) -> None:
    """The per-GPU measuring process (`gpu_procs`): a job, the profile and the settings travel to
    it; on a host without that GPU its refusal comes back as the tuner's own error, no traceback."""
    from xgbuild.compiler.driver import compile_source
    from xgbuild.hw import load_profile
    from xgbuild.settings import Settings
    from xgbuild.tuner.gpu_procs import GpuProcess, GpuUnavailable, visible_device
    from xgbuild.tuner.jobs import plan, tuning_env
    graph = compile_source("extern Tensor[float32, M, K] A\nextern Tensor[float32, K, N] B\n"
                           "def main() {\n    return A @ B\n}\n").optimized.main
    jobs, _ = plan(graph, tuning_env(graph, {"M": 64, "K": 64, "N": 64}))
    proc = GpuProcess(1, Settings(cache_dir=tmp_path / "cache"), load_profile("H100"), "measure", None, 1)
    try:
        with pytest.raises(GpuUnavailable, match="did not start: TuneError: .*finds no H100 GPU"):
            proc.tune(jobs[0], 0)
    finally:
        proc.close()
    assert visible_device(3) == "3"


def testgpu_processes_only_for_several_real_gpus() -> None:
    from xgbuild.hw import load_profile
    from xgbuild.tuner.link import gpu_processes
    from xgbuild.tuner.tuner import Compiler

    class Fake:
        device_index = 0
    compiler = Compiler(90)
    assert gpu_processes([Fake(), Fake()], None, load_profile("H100"), "measure", None, compiler) == []
    assert gpu_processes([], None, load_profile("H100"), "measure", None, compiler) == []


def test_a_gpu_process_still_starting_is_not_waited_for(tmp_path: Path) -> None:
    import time
    from xgbuild.hw import load_profile
    from xgbuild.settings import Settings
    from xgbuild.tuner.gpu_procs import GpuProcess
    proc = GpuProcess(1, Settings(cache_dir=tmp_path / "cache"), load_profile("H100"), "measure", None, 1)
    t0 = time.monotonic()
    proc.close()                                # at once: its start (torch, the profile) is not awaited
    assert time.monotonic() - t0 < 2.0
    assert proc._worker.proc.poll() is not None


def test_compile_workers_run_nicer_than_the_build() -> None:
    """Compiles yield the CPUs to the GPU-measuring loops: a pool's workers (and ptxas under them)
    raise their niceness; a plain Worker (a GPU's measuring process) does not."""
    import os
    from xgbuild.tuner.workers import SubprocessPool, Worker
    pool = SubprocessPool(1, nice=7)
    try:
        assert pool.submit(os.nice, 0).result(timeout=60) == os.nice(0) + 7
    finally:
        pool.shutdown()
    plain = Worker()
    try:
        assert plain.call(os.nice, (0,)) == os.nice(0)
    finally:
        plain.close()
