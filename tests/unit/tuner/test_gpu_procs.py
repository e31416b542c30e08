"""Several GPUs, each measuring from a process of its own (`gpu_procs`), simulated on a CPU: the
measuring processes are real subprocesses with fake measurers (`find`), so a test sees which
process measured a job (the fake's GPU name carries its pid). With one GPU nothing is started;
winners reach the cache from the build's writer thread; a process that dies hands its jobs on, and
when none is left the build fails in one line."""

from __future__ import annotations

import concurrent.futures as cf
import os
import pickle
import threading
from pathlib import Path

import pytest

from xgbuild.cache import Cache
from xgbuild.cache.errors import CacheError
from xgbuild.compiler.codegen.templates.base import config_key
from xgbuild.hw import load_profile
from xgbuild.settings import Settings
from xgbuild.tuner import dispatch, gpu_procs, link
from xgbuild.tuner.cuda_measure import CudaMeasurer
from xgbuild.tuner.gpu_procs import GpuProcess, handoff
from xgbuild.tuner.tuner import Compiler, Tuner, TuneError

from .test_gpu_start import Starting
from .test_tuner import FakeMeasurer, _two_softmax_jobs


class PidMeasurer(FakeMeasurer):
    """A fake GPU whose name says which process measured on it."""

    def __init__(self) -> None:
        super().__init__({})
        self.gpu_name = f"fake GPU in process {os.getpid()}"


def fake_gpus(profile) -> list:
    """`GpuProcess(find=...)`: what a measuring process measures with, on a CPU host."""
    return [PidMeasurer()]


class DyingMeasurer(FakeMeasurer):
    def measure(self, *args):
        os._exit(3)             # the GPU's process dies mid-job (a driver crash, the OOM killer)


def dying_gpus(profile) -> list:
    return [DyingMeasurer({})]


@pytest.fixture
def importable(monkeypatch):
    """Measuring processes that can import this module (for `fake_gpus`)."""
    root = Path(__file__).resolve().parents[__name__.count(".")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def _tune(jobs, procs, cache=None, measurers=None):
    compiler = Compiler(90, cache)
    try:
        return link.tune_jobs(jobs, load_profile("H100"), policy="measure", cache=cache, compiler=compiler,
                              measurers=measurers or [FakeMeasurer({}), FakeMeasurer({})], gpu_procs=procs)
    finally:
        compiler.close()


def test_with_two_gpus_gpu_0_measures_in_a_process_of_its_own_and_the_build_records(tmp_path, importable) -> None:
    """Two GPUs, a process each: no job is measured in the build's process, and the winners the
    processes send back are in the cache when the build returns (written by the build)."""
    settings = Settings(cache_dir=tmp_path / "cache")
    cache = Cache.open(settings)
    profile = load_profile("H100")
    procs = [GpuProcess(i, settings, profile, "measure", None, 1, find=fake_gpus) for i in range(2)]
    try:
        jobs = _two_softmax_jobs() * 2
        winners = _tune(jobs, procs, cache)
        pids = {p._worker.proc.pid for p in procs}
    finally:
        for p in procs:
            p.close()
    assert set(winners) == {j.ident for j in jobs}
    measured_in = {int(w.measured_on.rsplit(" ", 1)[1]) for w in winners.values()}
    assert os.getpid() not in measured_in and measured_in <= pids
    probe = Tuner(profile, policy="strict", cache=cache)
    for job in jobs:
        assert probe.tune(job).config == winners[job.ident].config
    cache.close()


class FakeCuda(CudaMeasurer):
    """A `CudaMeasurer` as `local_measurers` makes one, without a GPU behind it."""

    def __init__(self, index: int) -> None:
        self.device_index, self.device, self.gpu_name = index, "cpu", FakeMeasurer.gpu_name
        self.fake = FakeMeasurer({})

    def measure(self, job, variant, config, emitted, binary, data, stop_above=None):
        return self.fake.measure(job, variant, config, emitted, binary, data)


def test_every_gpu_of_several_gets_a_process_naming_it_and_one_gpu_none(monkeypatch) -> None:
    started: list[dict] = []

    class Recorded:                 # a worker process that is never started
        def __init__(self, env):
            started.append(env)

        def call(self, fn, args):
            raise OSError("not started in this test")

        def close(self):
            pass

    monkeypatch.setattr(gpu_procs, "Worker", Recorded)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("XG_TUNE_IN_PROCESS", raising=False)
    profile = load_profile("H100")
    procs = link.measuring_processes([FakeCuda(0), FakeCuda(1)], None, profile, "measure", None, 8)
    for p in procs:
        p.close()
    assert [p.device_index for p in procs] == [0, 1]
    assert started == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]   # GPU 0's own too
    started.clear()
    assert link.measuring_processes([FakeCuda(0)], None, profile, "measure", None, 8) == []
    # One GPU: measured in the build's process, nothing started.
    jobs = _two_softmax_jobs()
    winners = _tune(jobs, None, measurers=[FakeCuda(0)])
    assert set(winners) == {j.ident for j in jobs} and started == []
    assert {w.measured_on for w in winners.values()} == {FakeMeasurer.gpu_name}


def test_a_process_that_dies_hands_its_job_to_the_other_gpu(tmp_path, importable, capsys) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    dying = GpuProcess(0, settings, load_profile("H100"), "measure", None, 1, find=dying_gpus)
    other = Starting(0.0)
    try:
        dying.started()
        jobs = _two_softmax_jobs()
        winners = _tune(jobs, [dying, other])
    finally:
        dying.close()
    assert set(winners) == {j.ident for j in jobs} and sorted(other.taken) == sorted(j.ident for j in jobs)
    assert "warning: GPU 0's measuring process died" in capsys.readouterr().err


def test_when_every_gpu_gives_up_the_build_fails_in_one_line(capsys) -> None:
    jobs = _two_softmax_jobs()
    with pytest.raises(TuneError) as info:
        _tune(jobs, [Starting(0.02, fails=True), Starting(0.02, fails=True)])
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"tuning failed: no GPU is left to measure {len(jobs)} of")
    assert "did not start" in message and "Traceback" not in capsys.readouterr().err


def test_a_handoff_gives_the_process_the_first_wave_and_nothing_is_compiled_again(tmp_path) -> None:
    """The build's tuner compiles a job's first wave; the process's tuner gets it (pickled, as it
    travels) and measures without compiling or looking up any of it; a candidate that failed to
    compile here fails there too."""
    profile = load_profile("H100")
    job = _two_softmax_jobs()[0]
    cands = Tuner(profile).candidates(job)[:3]
    keys = [config_key(c) for c in cands]
    here = Tuner(profile, policy="measure", compiler=Compiler(90))
    here.candidates = lambda j: cands
    real_submit = here._submit

    def submit(j, c, priority):           # the third candidate fails to compile here
        variant, em, fut = real_submit(j, c, priority)
        if c.key != keys[2]:
            return variant, em, fut
        failed: cf.Future = cf.Future()
        failed.set_exception(RuntimeError("out of resource: shared memory"))
        return variant, em, failed

    here._submit = submit
    here.prefetch(job, 0)
    wave = dispatch._await_first_wave(here, job)
    given = pickle.loads(pickle.dumps(handoff(here, job, wave)))
    assert set(given.wave) == set(keys)

    class NoCompiles(Compiler):
        def submit(self, *a, **k):
            raise AssertionError("compiled or looked up a candidate it was handed")

    there = Tuner(profile, policy="measure", measurer=FakeMeasurer({keys[1]: 0.1}), compiler=NoCompiles(90))
    there.preset(job, given.candidates, given.ranked, given.seed, given.wave)
    w = there.tune(job, looked_up=True, record=False)
    here.compiler.close()
    assert config_key(w.config) == keys[1] and "compile failed: out of resource" in w.rejected[keys[2]]


def test_a_measuring_process_starts_its_compile_pool_at_its_first_job_not_with_the_process(monkeypatch) -> None:
    """The process comes up while the build's pool compiles the first waves every GPU waits for:
    its own pool's workers (warming up: Triton's import, a first compile) start only with its first
    job, which brings its first wave compiled, and only once."""
    monkeypatch.setattr(gpu_procs, "_STATE", {})
    profile = load_profile("H100")
    args = (None, (profile.name, None, profile.to_dict()), "measure", None, 1, fake_gpus)
    assert gpu_procs.tune_here(*args) is None
    tuner = gpu_procs._STATE["tuner"]
    assert tuner.compiler._pool is None                 # up, and no compile worker started
    starts: list[int] = []
    real = tuner.compiler.start
    tuner.compiler.start = lambda: starts.append(1) or real()
    jobs = _two_softmax_jobs()
    for job in jobs:
        assert gpu_procs.tune_here(*args, pickle.dumps((job, 0, None))).source == "measured"
    assert starts == [1] and tuner.compiler._pool is not None
    tuner.compiler.close()


# --- the winner writer -----------------------------------------------------------------------------

def test_winners_are_written_by_a_thread_of_their_own_before_the_build_returns(tmp_path) -> None:
    cache = Cache.open(Settings(cache_dir=tmp_path / "cache"))
    writers: list[str] = []
    real = cache.store

    def store(key, value, blobs=None):
        if value.get("how") == "measured":
            writers.append(threading.current_thread().name)
        return real(key, value, blobs)

    cache.store = store
    jobs = _two_softmax_jobs()
    winners = _tune(jobs, None, cache, measurers=[FakeMeasurer({})])
    assert writers == ["xg-winner-writer"] * len(jobs)
    probe = Tuner(load_profile("H100"), policy="strict", cache=cache)
    assert all(probe.tune(j).config == winners[j.ident].config for j in jobs)
    cache.close()


def test_a_winner_the_cache_refuses_is_reported_and_any_other_failure_fails_the_build(tmp_path, capsys) -> None:
    cache = Cache.open(Settings(cache_dir=tmp_path / "cache"))
    real = cache.store
    failure: list[BaseException] = [CacheError("disk I/O error")]

    def store(key, value, blobs=None):
        if value.get("how") == "measured":
            raise failure[0]
        return real(key, value, blobs)

    cache.store = store
    jobs = _two_softmax_jobs()
    winners = _tune(jobs, None, cache, measurers=[FakeMeasurer({})])
    assert set(winners) == {j.ident for j in jobs}          # the build goes on, and says so
    assert (f"warning: {len(jobs)} measured winner(s) could not be written to the XG cache (CacheError: disk "
            "I/O error)") in capsys.readouterr().err
    failure[0] = TypeError("a bug in the record")
    with pytest.raises(TypeError, match="a bug in the record"):
        _tune(jobs, None, cache, measurers=[FakeMeasurer({})])
    cache.close()
