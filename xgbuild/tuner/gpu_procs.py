"""Measuring on several GPUs of a host: one process per GPU, each with its own tuner.

Threads measuring in one process share its interpreter lock, and a candidate's measurement is
as much Python (binding, launching, timing runs, checking) as GPU time for most kernels: two
GPUs in one process tuned 1.3-1.4x the jobs per minute of one. Here each GPU (GPU 0 too: the
build's process then only coordinates, looks up and compiles) gets a process (`workers.Worker`,
`CUDA_VISIBLE_DEVICES` naming its GPU alone) that keeps a `Tuner`, a `CudaMeasurer`, a compile
pool (its share of the host's CPUs) and the XG cache open between jobs; the parent hands it jobs
one at a time, in order, with what it already worked out for each (`Handoff`: the candidates,
their ranking and the first wave's kernels compiled so far), and gets the winners back, which it
records. Cubins meet in the shared XG cache (and Triton's), so the parent links the winners
without compiling them again.

A job is handed over as soon as the first candidate of its wave is compiled, not the whole wave
(its slowest compile held each GPU's first job seconds): the wave's other compiles go on in the
parent's pool, and the process asks for each when its search reaches it (`workers.ask`, answered
by `Prepared.answer` while the parent waits for the winner): the kernel, why it failed to compile
(the candidate scores inf, as any failed compile), or nothing (not compiled there: the process
compiles it). The parent makes a job ready (`prepare`: ranking, the `Handoff`, pickling) while the
process measures the one before, so that the process gets it as soon as it answers; it sends it
only once that answer is read (the process reads nothing while it measures).
"""

from __future__ import annotations

import concurrent.futures as futures
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..settings import visible_device, visible_devices
from .jobs import Job
from .tuner import Compiler, TuneError, Tuner, Winner
from .workers import Worker, WorkerDied, ask

_STATE: dict[str, Any] = {}        # in a measuring process: its tuner, made by the first call


class GpuUnavailable(RuntimeError):
    """A GPU's measuring process could not start or died: its jobs go to the other GPUs."""


def _profile(name: str, hw_dir: Any, expected: dict) -> Any:
    """The parent's GPU profile, loaded again here (profiles hold read-only mappings that do not
    pickle); one that differs would give other cache keys, so it is refused."""
    from ..hw import load_profile
    profile = load_profile(name, hw_dir)
    if profile.to_dict() != expected:
        raise TuneError(f"the measuring process loaded another {name} profile than the build's (from {hw_dir})")
    return profile


@dataclass(frozen=True)
class Handoff:
    """What the build's tuner worked out for a job before a measuring process gets it (see
    `Tuner.preset`): the process would otherwise prune, rank and emit the candidates again and
    read the first wave's cubins back from the cache."""
    candidates: list
    ranked: list
    seed: str | None
    # config key -> (variant, emitted, KernelBinary), (variant, emitted or None, why it failed) or
    # (variant, emitted, None): still compiling in the build's process (the process asks for it)
    wave: dict


def handoff(tuner: Tuner, job: Job, wave: dict) -> Handoff:
    """`job`'s `Handoff` from `tuner`, given its first wave (`Tuner.prefetch`'s entries): the
    compiles done by now with their outcome, the others as still compiling."""
    done: dict = {}
    for k, (variant, em, got) in wave.items():
        if em is None:
            done[k] = (variant, None, str(got))
        elif got.done() and not got.cancelled():
            exc = got.exception()
            done[k] = (variant, em, got.result()[0] if exc is None else _why(exc))
        else:
            done[k] = (variant, em, None)
    return Handoff(tuner.candidates(job), tuner.ranked(job), tuner.wave_seed(job), done)


def _why(exc: BaseException) -> str:
    """A failed compile, in a line (what a measured job's `rejected` says)."""
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


ANSWER_TIMEOUT_S = 120.0    # a wave compile the parent has not finished after this is compiled by the process


@dataclass
class Prepared:
    """A job made ready for a measuring process (`prepare`): `packed` is what the process unpickles,
    `wave` the build's own entries (`Tuner.prefetch`'s, futures), which answer the process's
    questions about the compiles still running and go back with the job if the process dies."""
    job: Job
    priority: float
    wave: dict
    packed: bytes
    asked: set = field(default_factory=set)

    def answer(self, key: str) -> Any:
        """For the process measuring the job: wave compile `key`'s KernelBinary, why it failed
        (str), or None (not compiled here, or not within `ANSWER_TIMEOUT_S`: the process compiles
        it)."""
        self.asked.add(key)
        entry = self.wave.get(key)
        if entry is None or entry[1] is None:
            return None
        try:
            return entry[2].result(timeout=ANSWER_TIMEOUT_S)[0]
        except (futures.TimeoutError, futures.CancelledError):
            return None
        except Exception as exc:  # noqa: BLE001 (the compile's failure, for the candidate)
            return _why(exc)

    def release(self, tuner: Tuner) -> None:
        """Once the process is done with the job (a winner or an error): cancel the wave's compiles
        it never asked for that are still queued (its search stopped before them), as
        `Tuner.measure` does with its own."""
        configs = {c.key: c.config for c in tuner.ranked(self.job)}
        for k, (_variant, em, got) in self.wave.items():
            if em is not None and k not in self.asked and k in configs and not got.done():
                tuner.compiler.release(em, configs[k]["num_warps"], configs[k]["num_stages"])


def prepare(tuner: Tuner, job: Job, priority: float, wave: dict) -> Prepared:
    """`job` ready for a measuring process: its `Handoff` from `tuner`, pickled now (a wave's
    cubins are hundreds of KB), off the path between the process's jobs."""
    packed = pickle.dumps((job, priority, handoff(tuner, job, wave)), protocol=pickle.HIGHEST_PROTOCOL)
    return Prepared(job, priority, wave, packed)


def _local_measurers(profile: Any) -> list:
    from .cuda_measure import local_measurers
    return local_measurers(profile)


def tune_here(settings: Any, profile_ref: tuple, policy: str, budget_s: float | None, workers: int,
              find: Callable[[Any], list] | None, packed: bytes | None = None, waited_s: float = 0.0) -> Winner | None:
    """Runs in a measuring process: the winner of the job in `packed` (`Prepared.packed`: the job,
    its priority and its `Handoff` or None), measured on this process's one GPU (None: only start
    the tuner, its GPU, cache and compile workers), not recorded (the build's process records it).
    `find(profile)`: this process's measurers (default: its local GPUs of the profile's model; a
    test passes fakes). `waited_s`: how long the build's process held the job back waiting for its
    first candidate's compile, counted as the job's waiting for compiles."""
    tuner = _STATE.get("tuner")
    if tuner is None:
        profile = _profile(*profile_ref)
        cache = None
        if settings is not None:
            from ..cache import Cache
            cache = Cache.open(settings)
        measurers = (find or _local_measurers)(profile)
        if not measurers:
            raise TuneError(f"the measuring process for GPU {','.join(visible_devices())} finds no "
                            f"{profile.name} GPU")
        # The build's own process compiles every job's first candidates and hands them over;
        # this pool compiles what a job here needs beyond them (`start_pool`).
        compiler = Compiler(profile.sm, cache, workers)
        tuner = _STATE["tuner"] = Tuner(profile, policy=policy, cache=cache, measurer=measurers[0],
                                        budget_s=budget_s, compiler=compiler)
    if packed is None:
        return None
    job, priority, given = pickle.loads(packed)
    start_pool(tuner)
    if given is not None:
        tuner.preset(job, given.candidates, given.ranked, given.seed, given.wave, fetch=_from_build)
    winner = tuner.tune(job, priority=priority, looked_up=True, record=False)
    if waited_s and winner.search:
        for k in ("seconds", "waiting_s"):
            if k in winner.search:
                winner.search[k] = round(winner.search[k] + waited_s, 3)
    return winner


def _from_build(key: str) -> Any:
    """In a measuring process, for `Tuner.preset`: the build's process's answer for wave compile
    `key` (`Prepared.answer`): its KernelBinary, or None (compile it here); raises why it failed."""
    try:
        got = ask(key)
    except Exception:  # noqa: BLE001 (no answer is not the compile's failure: compiled here, same outcome)
        return None
    if isinstance(got, str):
        raise RuntimeError(got)
    return got


def start_pool(tuner: Tuner) -> None:
    """Start a measuring process's compile pool, at its first job: not with the process, whose
    start (seconds of torch and CUDA) overlaps the first waves' compiles in the build's pool, which
    every GPU waits for; the pool's workers, warming up then (Triton's import and a first compile,
    0.7 CPU-seconds each, a share of the host's CPUs per GPU), would slow those compiles. Its first
    job comes with its first candidate compiled and the rest of its wave compiling in the build's
    pool (`Handoff`), so the workers warm up while that wave is measured, before the job needs a
    candidate beyond it; not at the first such candidate (its workers' start then held that job
    seconds)."""
    if not _STATE.get("pool started"):
        _STATE["pool started"] = True
        tuner.compiler.start()


class GpuProcess:
    """One GPU's measuring process, as `dispatch.Dispatch` drives it: `tune(job, priority, given=Prepared)`
    -> Winner, which the caller records. `find`: a picklable `(profile) -> measurers` the process
    measures with (default: its GPU; tests pass fakes)."""

    takes_handoff = True        # `Dispatch.feed` hands it each job `prepare`d, with its first wave

    def __init__(self, device_index: int, settings: Any, profile: Any, policy: str, budget_s: float | None,
                 workers: int, find: Callable[[Any], list] | None = None) -> None:
        self.device_index = device_index
        hw_dir = getattr(settings, "hw_dir", None)
        self._args = (settings, (profile.name, hw_dir, profile.to_dict()), str(policy), budget_s, max(1, workers),
                      find)
        self._worker = Worker({"CUDA_VISIBLE_DEVICES": visible_device(device_index)})
        self._lock = threading.Lock()           # one call at a time on the worker's pipes
        self._starting: BaseException | None = None
        self._t0 = time.monotonic()
        self.ready_s: float | None = None       # seconds from here until its GPU, cache and pool were up
        self._ready = threading.Thread(target=self._start, daemon=True)
        self._ready.start()

    def _start(self) -> None:
        try:
            with self._lock:
                self._worker.call(tune_here, self._args)
            self.ready_s = round(time.monotonic() - self._t0, 3)
        except BaseException as exc:  # noqa: BLE001 (reported by the first job)
            self._starting = exc

    def started(self, timeout_s: float | None = None) -> bool:
        """Whether the process is up (waiting up to `timeout_s`; None: until it is); GpuUnavailable
        when its start failed."""
        self._ready.join(timeout_s)
        if self._ready.is_alive():
            return False
        if self._starting is not None:
            raise GpuUnavailable(f"GPU {self.device_index}'s measuring process did not start: "
                                 f"{type(self._starting).__name__}: {self._starting}")
        return True

    def tune(self, job: Job, priority: float = 0, looked_up: bool = True, given: Prepared | None = None,
             waited_s: float = 0.0) -> Winner:
        """`job`'s winner from the process: `given` (for `job`) when it was `prepare`d, which also
        answers the process's questions about its wave; `waited_s`: see `tune_here`."""
        self.started()
        packed = given.packed if given is not None else pickle.dumps((job, priority, None))
        with self._lock:
            try:
                return self._worker.call(tune_here, (*self._args, packed, round(waited_s, 3)),
                                         answer=given.answer if given is not None else None)
            except WorkerDied as exc:
                raise GpuUnavailable(f"GPU {self.device_index}'s measuring process died: {exc}") from None

    def close(self) -> None:
        """Stop the process; one still starting (the other GPUs took every job first) is killed
        rather than waited for."""
        if self._ready.is_alive():
            self._worker.proc.kill()
        self._ready.join()
        self._worker.close()
