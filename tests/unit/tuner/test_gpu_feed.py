"""Feeding measuring processes (`gpu_procs`, `dispatch.Dispatch`), simulated on a CPU with real
subprocesses and fake measurers: a job goes to its process once its first candidate is compiled,
and the process asks the build for the rest of the wave as it reaches them (a compile that failed
there is that candidate's failure, not waited on nor compiled again); a process's next job is
prepared while it measures and goes back with its job when it dies; the build's stats give each
GPU's timeline."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from xgbuild.compiler.codegen.templates import emit
from xgbuild.compiler.codegen.templates.base import config_key
from xgbuild.compiler.driver import compile_source
from xgbuild.hw import load_profile
from xgbuild.settings import Settings, visible_device
from xgbuild.tuner import dispatch, gpu_procs, link
from xgbuild.tuner.gpu_procs import GpuProcess
from xgbuild.tuner.jobs import plan, tuning_env
from xgbuild.tuner.search import first_wave
from xgbuild.tuner.tuner import LOOKAHEAD, Compiler, Tuner
from xgbuild.tuner.workers import Worker, ask

from .test_gpu_procs import dying_gpus, fake_gpus, importable  # noqa: F401 (a fixture)
from .test_gpu_start import Starting
from .test_tuner import FakeMeasurer

SOFTMAXES = """extern Tensor[float32, T, D] X
extern Tensor[float32, T, D] Y
extern Tensor[float32, T, D] Z
def main() {
    return softmax(X, dim=1) + softmax(Y * 2.0, dim=1) + softmax(Z * 3.0, dim=1)
}
"""
DIMS = {"T": 64, "D": 128}


def _jobs() -> list:
    """Three measured jobs of three kernels (each measures all its candidates: a memory-bound kind)."""
    g = compile_source(SOFTMAXES).optimized.main
    return plan(g, tuning_env(g, DIMS))[0]


class Gated(Compiler):
    """The build's compiler with one candidate's compile held until a measuring process asks for
    it (`Prepared.answer`): then it is given, or fails with `fail`. Not asked within a minute (a
    build that waited for it before handing the job over), it is given anyway, noted in `timed_out`."""

    def __init__(self, job, key: str, fail: str | None = None) -> None:
        super().__init__(90)
        cfg = next(c.config for c in Tuner(load_profile("H100")).ranked(job) if c.key == key)
        self.gated = (emit(job.spec, cfg, job.fast_variant(cfg)).source, cfg["num_warps"], cfg["num_stages"])
        self.fail = fail
        self.asked = threading.Event()
        self.timed_out: bool | None = None

    def submit(self, em, num_warps, num_stages, priority=0):
        fut = super().submit(em, num_warps, num_stages, priority)
        if (em.source, num_warps, num_stages) != self.gated:
            return fut
        held: cf.Future = cf.Future()

        def release() -> None:
            self.timed_out = not self.asked.wait(60)
            if self.fail is not None:
                held.set_exception(RuntimeError(self.fail))
            else:
                held.set_result(fut.result())

        threading.Thread(target=release, daemon=True).start()
        return held


def _last_of_wave(job) -> str:
    """The candidate `job` measures last of its first wave (no seed: a fresh cache)."""
    return first_wave(Tuner(load_profile("H100")).ranked(job), None, LOOKAHEAD)[-1].key


def _through_processes(tmp_path, monkeypatch, compiler, jobs) -> tuple[dict, list]:
    """Tune `jobs` on two measuring processes with `compiler` as the build's; (winners, the
    config keys the processes asked the build for)."""
    asked: list[str] = []
    real = gpu_procs.Prepared.answer

    def answer(self, key):
        asked.append(key)
        if isinstance(compiler, Gated):
            compiler.asked.set()
        return real(self, key)

    monkeypatch.setattr(gpu_procs.Prepared, "answer", answer)
    settings = Settings(cache_dir=tmp_path / "cache")
    procs = [GpuProcess(i, settings, load_profile("H100"), "measure", None, 1, find=fake_gpus) for i in range(2)]
    try:
        winners = link.tune_jobs(jobs, load_profile("H100"), policy="measure", compiler=compiler,
                                 measurers=[FakeMeasurer({}), FakeMeasurer({})], gpu_procs=procs)
    finally:
        for p in procs:
            p.close()
        compiler.close()
    return winners, asked


def _in_process(jobs) -> dict:
    compiler = Compiler(90)
    try:
        return link.tune_jobs(jobs, load_profile("H100"), policy="measure", compiler=compiler,
                              measurers=[FakeMeasurer({})])
    finally:
        compiler.close()


def test_a_job_goes_to_its_process_before_its_slowest_wave_compile_and_the_outcome_is_the_same(
        tmp_path, importable, monkeypatch) -> None:
    """The first job's last wave candidate compiles only once a process asks for it: the job was
    handed over without it, the process got the build's kernel when its search reached it, and
    every job's winner and search are what measuring in the build's own process gives."""
    jobs = _jobs()
    gated = _last_of_wave(jobs[0])
    compiler = Gated(jobs[0], gated)
    winners, asked = _through_processes(tmp_path, monkeypatch, compiler, jobs)
    assert compiler.timed_out is False and gated in asked
    alone = _in_process(jobs)
    counts = ("candidates", "compiled", "measured", "failed", "pruned")
    for job in jobs:
        w, ref = winners[job.ident], alone[job.ident]
        assert w.measured_on.startswith("fake GPU in process") and not w.rejected
        assert w.config == ref.config and {k: w.search[k] for k in counts} == {k: ref.search[k] for k in counts}


def test_a_wave_compile_that_fails_in_the_build_is_that_candidates_failure_in_the_process(
        tmp_path, importable, monkeypatch) -> None:
    """The build's compile of a handed-over candidate fails after the hand-over: the process, told
    so when it asks, scores it inf with the build's reason (it neither waits on it nor compiles
    it again: its own compile would succeed), and picks among the others."""
    jobs = _jobs()[:1]
    gated = _last_of_wave(jobs[0])
    compiler = Gated(jobs[0], gated, fail="out of resource: shared memory (in the build)")
    winners, asked = _through_processes(tmp_path, monkeypatch, compiler, jobs)
    w = winners[jobs[0].ident]
    assert compiler.timed_out is False and asked.count(gated) == 1
    assert w.rejected == {gated: "compile failed: out of resource: shared memory (in the build)"}
    assert w.search["failed"] == 1 and w.search["measured"] == w.search["candidates"] - 1
    keys = [c.key for c in Tuner(load_profile("H100")).ranked(jobs[0])]
    assert config_key(w.config) == min(k for k in keys if k != gated)       # (every time is a tie)


@pytest.mark.timeout(180)      # (a job lost with its process leaves the other GPU waiting for it)
def test_a_job_prepared_for_a_process_that_dies_goes_back_with_its_job(tmp_path, importable, monkeypatch,
                                                                       capsys) -> None:
    """The process dies measuring its first job while its second is prepared for it: both go back
    to the queue, in order, and the GPU that comes up afterwards tunes every job."""
    jobs = _jobs()
    prepared: list[str] = []
    real_prepare = dispatch._prepare
    monkeypatch.setattr(dispatch, "_prepare", lambda tuner, job, *a: prepared.append(job.ident)
                        or real_prepare(tuner, job, *a))
    died = threading.Event()

    class UpOnceTheOtherDied(Starting):
        def started(self, timeout_s=None) -> bool:
            return died.wait(timeout_s)

    settings = Settings(cache_dir=tmp_path / "cache")
    dying = GpuProcess(0, settings, load_profile("H100"), "measure", None, 1, find=dying_gpus)
    real_tune = dying.tune

    def tune(*args, **kwargs):
        try:
            return real_tune(*args, **kwargs)
        finally:
            died.set()

    dying.tune = tune
    other = UpOnceTheOtherDied(0.0)
    compiler = Compiler(90)
    try:
        dying.started()
        winners = link.tune_jobs(jobs, load_profile("H100"), policy="measure", compiler=compiler,
                                 measurers=[FakeMeasurer({}), FakeMeasurer({})], gpu_procs=[dying, other])
    finally:
        dying.close()
        compiler.close()
    assert prepared[:2] == [jobs[0].ident, jobs[1].ident]       # the second, for the process that died
    assert other.taken == [j.ident for j in jobs] and set(winners) == {j.ident for j in jobs}
    assert capsys.readouterr().err.count("warning: GPU 0's measuring process died") == 1


def test_the_build_stats_give_each_gpus_timeline(tmp_path, importable) -> None:
    """`by_gpu` in a build's stats says, per GPU, when its process was up, when its first job began
    and its last ended (seconds from the start of tuning), and the time between its jobs."""
    settings = Settings(cache_dir=tmp_path / "cache")
    profile = load_profile("H100")
    procs = [GpuProcess(i, settings, profile, "measure", None, 1, find=fake_gpus) for i in range(2)]
    graph = compile_source(SOFTMAXES).optimized.main
    try:
        for p in procs:
            p.started()
        table = link.build_kernels(graph, profile, policy="measure", dims=DIMS, workers=1,
                                   measurers=[FakeMeasurer({}), FakeMeasurer({})], gpu_procs=procs)
    finally:
        for p in procs:
            p.close()
    by_gpu = table.stats["by_gpu"]
    assert set(by_gpu) == {visible_device(0), visible_device(1)}
    worked = [t for t in by_gpu.values() if t["first_job_s"] is not None]
    assert worked and all(t["up_s"] is not None for t in by_gpu.values())
    for t in worked:
        assert 0 <= t["up_s"] <= t["first_job_s"] <= t["last_job_s"]
        assert 0 <= t["gaps_s"] <= t["last_job_s"] - t["first_job_s"]


# --- questions from a worker ------------------------------------------------------------------------

def asks_twice(size: int) -> bytes:
    """In a worker: two questions, then a reply of `size` bytes."""
    first = ask(size)
    try:
        ask(-1)
    except ValueError as exc:
        return first + str(exc).encode() + b"x" * size
    raise AssertionError("the answer's error was not raised")


def test_a_worker_asks_its_caller_mid_call_without_deadlocking_on_large_messages(importable) -> None:
    """Answers and replies larger than a pipe's buffer (64 KB) pass both ways; an answer that
    raises is raised in the worker; a call without `answer` refuses questions."""
    def answer(size: int) -> bytes:
        if size < 0:
            raise ValueError("no such size")
        return b"a" * size

    worker = Worker()
    try:
        size = 1 << 20
        got = worker.call(asks_twice, (size,), answer=answer)
        assert got == b"a" * size + b"no such size" + b"x" * size
        with pytest.raises(RuntimeError, match="answers no questions"):
            worker.call(ask, (1,))
    finally:
        worker.close()
