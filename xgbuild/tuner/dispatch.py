"""Dispatching tuning jobs to a host's GPUs (`Dispatch`): one runner per GPU takes the queued jobs.

A runner is a `Tuner` measuring from this process, or a GPU's measuring process (`gpu_procs`),
which measures while this process hands it its jobs and records its winners. Each runner loops in
a thread of its own (`worker`), taking the jobs in order and settling each: its winner, or the
error it ended with. A measuring process takes nothing until it is up (`_started`), gets each job
once the first candidate of its wave is compiled, made ready while it measures the one before
(`feed`), and when it gives up, hands back the jobs it held to whichever GPU is left. Each GPU's
`_Timeline` says when it was up, at work and idle between jobs.

What comes before and after (the lookups, compiling ahead, writing the winners to the cache) is
`link.tune_jobs`'s.
"""

from __future__ import annotations

import concurrent.futures as futures
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..compiler.codegen.templates.base import config_key
from .gpu_procs import GpuUnavailable, Prepared, prepare
from .jobs import Job
from .progress import TuneProgress
from .tuner import StrictMiss, Tuner, TuneError, Winner


class Dispatch:
    """The jobs of `queue` ((index, job) pairs, in order) over the GPUs' runners: the tuners, or
    the measuring processes `procs` when there are any (with `tuners[0]` measuring here too when
    they are fewer than the tuners: a test's). Winners go to `winners` and `bar`; `run` returns once
    the jobs are settled, the build failed (`errors`) or every GPU gave up (the jobs left stay in
    `queue`, and why each GPU gave up in `unavailable`)."""

    def __init__(self, tuners: list[Tuner], procs: list, queue: list[tuple[int, Job]], winners: dict[str, Winner],
                 bar: TuneProgress, measuring: bool) -> None:
        self.tuners, self.queue, self.winners, self.bar, self.measuring = tuners, queue, winners, bar, measuring
        self.runners: list[Any] = tuners if not procs else [tuners[0], *procs] if len(procs) < len(tuners) else procs
        self.missing: list[str] = []            # --tune=strict: each job with no cached winner, and why
        self.errors: list[BaseException] = []   # what the build failed with, the first first
        self.unavailable: list[str] = []        # why each GPU that gave up did
        # A GPU whose queue ran dry waits while another holds a job: a process that dies gives
        # its jobs back, for whichever GPU is left.
        self.changed = threading.Condition(threading.Lock())
        self.held = 0                   # jobs the GPUs hold now (a process's prepared next job too)
        self.lines = {id(runner): _Timeline() for runner in self.runners}
        self.t_line = 0.0               # when the runners started (`time.monotonic`): the timelines' zero

    def run(self) -> None:
        """Every runner's loop, each in a thread of its own when there are several."""
        self.t_line = time.monotonic()
        if len(self.runners) == 1:
            self.worker(self.runners[0])
        else:
            threads = [threading.Thread(target=self.worker, args=(t,)) for t in self.runners]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    def timelines(self) -> dict[str, dict]:
        """Each GPU's `_Timeline`, by the GPU's name (as `search["gpu"]` gives it)."""
        return {_gpu_of(r, n): self.lines[id(r)].to_json() for n, r in enumerate(self.runners)}

    def raise_failure(self, total: int) -> None:
        """Raise the build's first error, or a TuneError when every GPU gave up with jobs left
        (each warned as it did); `total`: how many jobs the build tunes."""
        if self.errors:
            raise self.errors[0]
        if self.queue:
            raise TuneError(f"tuning failed: no GPU is left to measure {len(self.queue)} of {total} jobs "
                            f"({'; '.join(self.unavailable) or 'no GPU took a job'}); XG_TUNE_IN_PROCESS=1 "
                            "measures from the build's own process instead")

    def take(self, wait: bool, spare: int = 0) -> tuple[int, Job] | None:
        """The next job, now held; None when none is left (`wait`: none is left and no other
        GPU holds one it could give back) or the build failed, or when no more than `spare`
        are queued (left for the GPUs that will be free sooner)."""
        with self.changed:
            while wait and not self.queue and self.held and not self.errors:
                self.changed.wait()
            if len(self.queue) <= spare or self.errors:
                return None
            self.held += 1
            return self.queue.pop(0)

    def give_back(self, exc: GpuUnavailable, jobs_held: list[tuple[int, Job, dict]]) -> None:
        """A GPU gave up: the jobs it held (and their first waves) go back to the front of the
        queue, in order; the other GPUs carry on."""
        sys.stderr.write(f"warning: {exc}; tuning on the other GPUs\n")
        with self.changed:
            self.unavailable.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            for i, job, wave in reversed(jobs_held):
                if wave:
                    self.tuners[0]._prefetched[job.ident] = wave
                self.queue.insert(0, (i, job))
                self.held -= 1
            self.changed.notify_all()

    def settle(self, job: Job, w: Winner | None, exc: BaseException | None = None) -> bool:
        """A held job's end: its winner, or the error it ended with; whether its GPU goes on."""
        with self.changed:
            self.held -= 1
            self.changed.notify_all()
            if isinstance(exc, StrictMiss):
                self.missing.append("\n    ".join([job.ident, *exc.report]))
                return True
            if exc is not None:
                self.errors.append(exc)
                return isinstance(exc, TuneError)
            assert w is not None
            self.winners[job.ident] = w
            try:
                self.bar.advance(job.ident, w.source, w.ms, w.search)
            except BaseException as exc:  # noqa: BLE001 (a thread's error is the build's, not a traceback)
                self.errors.append(exc)
                return False
            return True

    def record(self, job: Job, w: Winner) -> None:
        tuner = self.tuners[0]
        if w.source == "measured":     # a process measures; this one records
            tuner.record_winner(tuner.key(job), w)
            with tuner._neighbours_lock:
                tuner.seeds.setdefault(job.spec.name, config_key(w.config))

    def worker(self, runner: Any) -> None:
        """One GPU's loop: take a job, tune it on `runner`, settle it, until none is left."""
        if not _started(runner, lambda: (not self.queue and not self.held) or bool(self.errors), self.unavailable):
            return
        line = self.lines[id(runner)]
        line.up = time.monotonic() - self.t_line
        if getattr(runner, "takes_handoff", False):
            self.feed(runner, line)
            return
        tuners, measuring = self.tuners, self.measuring
        while (taken := self.take(wait=True)) is not None:
            i, job = taken
            wave: dict = {}
            try:
                self.bar.start_job(job.ident, len(tuners[0].candidates(job)) if measuring else 0)
                line.start(time.monotonic() - self.t_line)
                if runner in tuners:
                    w = runner.tune(job, priority=i, looked_up=bool(measuring))
                else:                       # a process that finds the wave in the shared cache
                    wave = _await_first_wave(tuners[0], job)
                    w = runner.tune(job, priority=i, looked_up=bool(measuring))
                    self.record(job, w)
                line.end(time.monotonic() - self.t_line, w)
            except GpuUnavailable as exc:
                self.give_back(exc, [(i, job, wave)])
                return
            except BaseException as exc:  # noqa: BLE001 (re-raised by raise_failure, on the main thread)
                if not self.settle(job, None, exc):
                    return
                continue
            if not self.settle(job, w):
                return

    def feed(self, proc: Any, line: _Timeline) -> None:
        """A measuring process's jobs, each `prepare`d while the process measures the one before
        (its first candidate compiled, its Handoff pickled): it is sent as soon as the process
        answers. A process that gives up gives back its job and the one prepared for it."""
        tuner = self.tuners[0]
        ahead = futures.ThreadPoolExecutor(1, thread_name_prefix=f"xg-prepare-{getattr(proc, 'device_index', '')}")

        def ready(taken: tuple[int, Job] | None) -> tuple | None:
            if taken is None:
                return None
            i, job = taken
            wave = tuner._prefetched.pop(job.ident, {})
            return i, job, wave, ahead.submit(_prepare, tuner, job, i, wave)

        try:
            nxt = ready(self.take(wait=True))
            while nxt is not None:
                i, job, wave, preparing = nxt
                t_free = time.monotonic()
                try:
                    given = preparing.result()
                except BaseException as exc:  # noqa: BLE001 (re-raised by raise_failure, on the main thread)
                    if not self.settle(job, None, exc):
                        return
                    nxt = ready(self.take(wait=True))
                    continue
                waited = time.monotonic() - t_free
                # The next job is taken now only while each other GPU would still find one.
                nxt = ready(self.take(wait=False, spare=len(self.runners) - 1))
                try:
                    self.bar.start_job(job.ident, len(tuner.candidates(job)))
                    line.start(t_free - self.t_line)        # (its wait for its first compile is its own)
                    w = proc.tune(job, priority=i, given=given, waited_s=waited)
                    line.end(time.monotonic() - self.t_line, w)
                    given.release(tuner)
                    self.record(job, w)
                except GpuUnavailable as exc:
                    self.give_back(exc, [(i, job, wave)] + ([nxt[:3]] if nxt else []))
                    return
                except BaseException as exc:  # noqa: BLE001 (re-raised by raise_failure, on the main thread)
                    given.release(tuner)        # its wave's compiles nobody asked for leave the pool
                    if not self.settle(job, None, exc):
                        break
                else:
                    if not self.settle(job, w):
                        break
                if nxt is None:
                    nxt = ready(self.take(wait=True))
            if nxt is not None:             # the build failed: the job prepared goes back
                with self.changed:
                    self.queue.insert(0, nxt[:2])
                    self.held -= 1
                    self.changed.notify_all()
        finally:
            ahead.shutdown(wait=False, cancel_futures=True)


START_TIMEOUT_S = 600.0     # a measuring process not up after this long is given up on


def _started(runner: Any, done: Any, unavailable: list | None = None, poll_s: float = 0.05,
             timeout_s: float = START_TIMEOUT_S) -> bool:
    """Whether a measuring process (`GpuProcess.started`) is up to take jobs; False when `done()`
    says the jobs ran out first (the other GPUs took them: nothing to wait for) or its start failed
    or took over `timeout_s` (warned, and why noted in `unavailable`: the other GPUs carry on). A
    job is taken only once the process is up, so that the jobs it would have held while starting
    go to the GPUs already measuring."""
    started = getattr(runner, "started", None)
    if started is None:
        return True
    deadline = time.monotonic() + timeout_s
    try:
        while not started(poll_s):
            if done():
                return False
            if time.monotonic() > deadline:
                raise GpuUnavailable(f"GPU {getattr(runner, 'device_index', '?')}'s measuring process did not "
                                     f"start in {timeout_s:.0f} s")
    except GpuUnavailable as exc:
        sys.stderr.write(f"warning: {exc}; tuning on the other GPUs\n")
        if unavailable is not None:
            unavailable.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return False
    return True


def _await_first_wave(tuner: Tuner, job: Job, timeout_s: float = 120.0, first: int | None = None) -> dict:
    """Before a measuring process gets `job`: take the compiles of its first wave that this process
    started ahead (`Tuner.prefetch`; they are the process's now, with the job) and wait for the
    first `first` of them in the order the job measures them (None: all; a process that finds
    them in the shared cache)."""
    wave = tuner._prefetched.pop(job.ident, {})
    _await_first(wave, timeout_s, first)
    return wave


def _await_first(wave: dict, timeout_s: float = 120.0, first: int | None = None) -> None:
    """Wait (up to `timeout_s`) for the first `first` compiles of a wave (None: all of them);
    candidates that could not even be emitted have nothing to wait for."""
    pending = [entry[2] for entry in wave.values() if entry[1] is not None][:first]
    if pending:
        futures.wait(pending, timeout=timeout_s)


def _prepare(tuner: Tuner, job: Job, priority: float, wave: dict) -> Prepared:
    """`job` ready for a measuring process (`gpu_procs.prepare`) once the first candidate it
    measures is compiled: the process asks for the rest of the wave as its search reaches them,
    so the wave's slowest compile does not hold the job."""
    _await_first(wave, first=1)
    return prepare(tuner, job, priority, wave)


@dataclass
class _Timeline:
    """One GPU's tuning, in seconds from its start (`tune_s`'s): when its measuring process was up
    (0 when it was up before), when its first job began, when its last ended, and how much of that
    span was spent between its jobs, outside their own seconds (`search["seconds"]`: handing a job
    over, recording its winner)."""
    up: float | None = None
    first: float | None = None
    last: float | None = None
    busy: float = 0.0               # its jobs' own seconds

    def start(self, at: float) -> None:
        if self.first is None:
            self.first = at

    def end(self, at: float, w: Winner) -> None:
        self.last = at
        self.busy += float(w.search.get("seconds", 0.0)) if isinstance(w.search, dict) else 0.0

    def to_json(self) -> dict:
        gaps = None if self.first is None or self.last is None else max(0.0, self.last - self.first - self.busy)
        return {k: None if v is None else round(v, 3) for k, v in (
            ("up_s", self.up), ("first_job_s", self.first), ("last_job_s", self.last), ("gaps_s", gaps))}


def _gpu_of(runner: Any, n: int) -> str:
    """The GPU a runner (a tuner or a measuring process) measures on, as a measured job's
    `search["gpu"]` names it; its place among the runners when it names none (a test's fakes)."""
    index = getattr(runner, "device_index", getattr(getattr(runner, "measurer", None), "device_index", None))
    if isinstance(index, int):
        from ..settings import visible_device
        return visible_device(index)
    return str(n)
