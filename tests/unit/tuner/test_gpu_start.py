"""Starting several GPUs' tuning: measuring processes take jobs only once they are up, the first
waves compile while the cache is still being looked up, compile workers warm up at start, and a
measured build's GPUs and compile pool start before its front end (`context.EarlyStart`)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from xgbuild.build import context
from xgbuild.hw import load_profile
from xgbuild.settings import Settings
from xgbuild.tuner import cuda_measure, link
from xgbuild.tuner.gpu_procs import GpuUnavailable
from xgbuild.tuner.policy import Policy
from xgbuild.tuner.tuner import Compiler, Tuner, Winner
from xgbuild.tuner.workers import SubprocessPool

from .test_tuner import FakeMeasurer, _two_softmax_jobs


class Starting:
    """A measuring process that is up after `up_s` seconds (or fails to start, `fails`)."""

    def __init__(self, up_s: float, fails: bool = False) -> None:
        self.t0, self.up_s, self.fails = time.monotonic(), up_s, fails
        self.taken: list[str] = []

    def started(self, timeout_s=None) -> bool:
        left = self.t0 + self.up_s - time.monotonic()
        if left > 0:
            time.sleep(min(left, timeout_s if timeout_s is not None else left))
            if self.t0 + self.up_s > time.monotonic():
                return False
        if self.fails:
            raise GpuUnavailable("GPU 1's measuring process did not start: RuntimeError: no device")
        return True

    def tune(self, job, priority=0, looked_up=True):
        assert self.started(0), "took a job before it was up"
        self.taken.append(job.ident)
        time.sleep(0.02)
        return Winner({"BLOCK_N": 128, "num_warps": 4, "num_stages": 1}, "measured", 1.0, "k")

    def close(self):
        pass


class Slow(FakeMeasurer):
    def measure(self, *args):
        time.sleep(0.03)
        return super().measure(*args)


def _tune(jobs, procs):
    compiler = Compiler(90)
    try:
        return link.tune_jobs(jobs, load_profile("H100"), policy="measure", measurers=[Slow({}), Slow({})],
                              compiler=compiler, gpu_procs=procs)
    finally:
        compiler.close()


def test_a_starting_process_takes_jobs_once_it_is_up_and_each_job_is_tuned_once(monkeypatch) -> None:
    """Jobs go to whichever GPU is free (the queue is shared): a process still starting holds
    none, and once up it takes its share; every job is tuned exactly once."""
    jobs = _two_softmax_jobs() * 4          # (the same job twice is two entries: tuned twice)
    seen: list[str] = []
    real = Tuner.tune

    def counting(self, job, priority=0, looked_up=False):
        seen.append(job.ident)
        return real(self, job, priority, looked_up)

    monkeypatch.setattr(Tuner, "tune", counting)
    proc = Starting(0.15)
    winners = _tune(jobs, [proc])
    assert set(winners) == {j.ident for j in jobs}
    assert proc.taken and len(seen) + len(proc.taken) == len(jobs)


def test_a_process_that_fails_to_start_takes_no_job(capsys) -> None:
    jobs = _two_softmax_jobs()
    proc = Starting(0.05, fails=True)
    winners = _tune(jobs, [proc])
    assert set(winners) == {j.ident for j in jobs} and not proc.taken
    assert "warning: GPU 1's measuring process did not start" in capsys.readouterr().err


def test_the_build_does_not_wait_for_a_process_that_starts_after_the_jobs_ran_out() -> None:
    jobs = _two_softmax_jobs()
    proc = Starting(30.0)
    t0 = time.monotonic()
    winners = _tune(jobs, [proc])
    assert set(winners) == {j.ident for j in jobs} and not proc.taken
    assert time.monotonic() - t0 < 15


def test_first_waves_compile_while_the_cache_is_still_looked_up(monkeypatch) -> None:
    """The thread compiling ahead gets each miss as the lookups find it: the first job's wave is
    queued before the last job is looked up."""
    jobs = _two_softmax_jobs()
    first_prefetched = threading.Event()
    real_lookup, real_prefetch = Tuner.from_cache, Tuner.prefetch

    def lookup(self, job, key):
        if job.ident == jobs[-1].ident:
            assert first_prefetched.wait(30), "the first wave waited for every lookup"
        return real_lookup(self, job, key)

    def prefetch(self, job, priority):
        real_prefetch(self, job, priority)
        if job.ident == jobs[0].ident:
            first_prefetched.set()

    monkeypatch.setattr(Tuner, "from_cache", lookup)
    monkeypatch.setattr(Tuner, "prefetch", prefetch)
    compiler = Compiler(90)
    try:
        winners = link.tune_jobs(jobs, load_profile("H100"), policy="measure", measurers=[FakeMeasurer({})],
                                 compiler=compiler)
    finally:
        compiler.close()
    assert set(winners) == {j.ident for j in jobs}


def test_workers_started_early_warm_up_first_and_a_failed_warm_up_costs_nothing() -> None:
    pool = SubprocessPool(2, warm=(exec, ("import os; os.environ['XG_TEST_WARMED'] = '1'",)))
    try:
        pool.start()
        assert [pool.submit(os.getenv, "XG_TEST_WARMED").result(timeout=60) for _ in range(4)] == ["1"] * 4
    finally:
        pool.shutdown()
    for warm in ((divmod, (1, 0)), (os._exit, (3,))):      # raises; kills its worker (replaced)
        pool = SubprocessPool(1, warm=warm)
        try:
            pool.start()
            assert pool.submit(max, 4, 9).result(timeout=60) == 9
        finally:
            pool.shutdown()


# --- starting before the front end -----------------------------------------------------------------

class Proc:
    def __init__(self, log):
        self.log = log

    def close(self):
        self.log.append("proc closed")


class FakeCompiler:
    workers = 4
    cache = None

    def __init__(self, log):
        self.log = log

    def start(self):
        self.log.append("pool started")

    def close(self):
        self.log.append("pool closed")


@pytest.fixture
def early_env(monkeypatch, tmp_path):
    log: list[str] = []
    monkeypatch.setattr(cuda_measure, "local_measurers", lambda profile: [FakeMeasurer({}), FakeMeasurer({})])
    monkeypatch.setattr(link, "new_compiler", lambda *a: FakeCompiler(log))
    monkeypatch.setattr(link, "measuring_processes", lambda *a: log.append("procs started") or [Proc(log)])
    monkeypatch.setenv("XG_CACHE_DIR", str(tmp_path / "cache"))
    return log, Settings.from_env()


def test_a_measured_step_takes_what_started_before_the_front_end(monkeypatch, early_env) -> None:
    log, settings = early_env
    monkeypatch.setattr(link, "gpu_processes", lambda *a: pytest.fail("started processes of its own"))
    with context.early_start(Policy.MEASURE, "H100", settings) as early:
        with context.tuning(load_profile("H100"), Policy.MEASURE, settings, early=early) as t:
            assert log == ["procs started", "pool started"] and len(t.gpu_procs) == 1
            assert t.compiler.cache is t.cache is not None      # the step's cache, set when taken
        assert log[2:] == ["proc closed", "pool closed"]        # the step closed them
    assert log.count("pool closed") == 1                        # and nothing was closed twice


def test_an_early_start_not_taken_is_closed(early_env) -> None:
    log, settings = early_env
    with pytest.raises(RuntimeError, match="the front end failed"):
        with context.early_start("measure", "H100", settings) as early:
            early._thread.join()
            raise RuntimeError("the front end failed")
    assert log == ["procs started", "pool started", "proc closed", "pool closed"]


def test_an_early_start_for_another_target_is_closed_and_the_step_starts_its_own(monkeypatch, early_env) -> None:
    log, settings = early_env
    monkeypatch.setattr(link, "gpu_processes", lambda *a: log.append("step's procs") or [Proc(log)])
    with context.early_start("measure", "H200", settings) as early:
        with context.tuning(load_profile("H100"), Policy.MEASURE, settings, early=early):
            assert log == ["procs started", "pool started", "proc closed", "pool closed", "step's procs",
                           "pool started"]


def test_an_early_start_that_fails_leaves_the_step_to_start_them(monkeypatch, early_env) -> None:
    log, settings = early_env

    def broken(*a):
        raise OSError("no more processes")

    monkeypatch.setattr(link, "measuring_processes", broken)
    monkeypatch.setattr(link, "gpu_processes", lambda *a: log.append("step's procs") or [Proc(log)])
    with context.early_start("measure", "H100", settings) as early:
        with context.tuning(load_profile("H100"), Policy.MEASURE, settings, early=early) as t:
            assert len(t.gpu_procs) == 1
    assert log == ["pool closed", "step's procs", "pool started", "proc closed", "pool closed"]


def test_no_early_start_for_builds_that_do_not_measure(early_env) -> None:
    log, settings = early_env
    for policy, target, kernels in (("cache", "H100", True), ("measure", None, True), ("measure", "H100", False)):
        with context.early_start(policy, target, settings, kernels=kernels) as early:
            assert early is None
    assert log == []
