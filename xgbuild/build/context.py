"""What a tuning step runs with: the XG cache (local store and remote tier, from the settings),
this host's measurers, a kernel compiler, and a lease on the host's GPUs while measuring; for a
measured build, those started before its front end runs (`EarlyStart`).
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..hw import GpuProfile
from ..settings import Settings
from ..tuner.policy import Policy


@dataclass(frozen=True)
class Tuning:
    """One step's tuning resources: `cache` is None when the XG cache could not be opened."""
    profile: GpuProfile
    policy: Policy
    cache: Any
    measurers: list
    compiler: Any           # tuner.Compiler: processes compiling kernels for the target's arch
    gpu_procs: list = ()    # tuner.gpu_procs.GpuProcess: with several GPUs, each measuring from a process of its own


class EarlyStart:
    """A measured build's GPUs and compile pool, started from a thread before its front end runs:
    this process's measurers (torch's import, CUDA's start), with several GPUs each one's
    measuring process, GPU 0's too (seconds each of the same) and the compile workers, so that their start-up overlaps parsing,
    checking and lowering instead of the first jobs. `tuning(early=...)` takes them when they are
    what its step needs (the same profile, workers and budget); `close` ends whatever was not
    taken, at once (a front end that fails does not wait for torch)."""

    def __init__(self, target: str, settings: Settings, workers: int | None = None,
                 budget_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._made: tuple | None = None     # (profile, measurers, compiler, procs, (workers, budget_s))
        self._thread = threading.Thread(target=self._start, args=(target, settings, workers, budget_s), daemon=True)
        self._thread.start()

    def _start(self, target: str, settings: Settings, workers: int | None, budget_s: float | None) -> None:
        from ..tuner.cuda_measure import local_measurers
        from ..tuner.link import measuring_processes, new_compiler
        from .target import target_profile
        made: tuple | None = None
        compiler, procs = None, []
        try:
            profile = target_profile(target, settings)
            measurers = local_measurers(profile)
            if measurers:               # (none: the step finds none either, and says so)
                compiler = new_compiler(profile, None, workers)     # the step's cache is set when taken
                procs = measuring_processes(measurers, settings, profile, Policy.MEASURE, budget_s,
                                            compiler.workers)
                compiler.start()
                made = (profile, measurers, compiler, procs, (workers, budget_s))
        except Exception:  # noqa: BLE001 (an early start is an optimisation: the step starts them again and reports)
            _close(procs, compiler)
            return
        with self._lock:
            if not self._closed:
                self._made = made
                return
        if made is not None:            # closed while starting
            _close(procs, compiler)

    def take(self, profile: GpuProfile, workers: int | None, budget_s: float | None) -> tuple | None:
        """(measurers, compiler, measuring processes) for a measured step on `profile`, now the
        caller's to close; None when they are not what it needs (then closed here) or did not start."""
        self._thread.join()
        with self._lock:
            made, self._made = self._made, None
        if made is None:
            return None
        if made[0].to_dict() != profile.to_dict() or made[4] != (workers, budget_s):
            _close(made[3], made[2])
            return None
        return made[1:4]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            made, self._made = self._made, None
        if made is not None:
            _close(made[3], made[2])


def _close(procs: list, compiler: Any) -> None:
    for p in procs:
        p.close()
    if compiler is not None:
        compiler.close()


@contextlib.contextmanager
def early_start(policy: Policy | str, target: str | None, settings: Settings, *, kernels: bool = True,
                workers: int | None = None) -> Iterator[EarlyStart | None]:
    """An `EarlyStart` for a build that will measure its kernels on a named target, closed after
    (what its tuning step took is the step's to close); None for any other build."""
    if not kernels or target is None or str(policy) != Policy.MEASURE.value:
        yield None
        return
    early = EarlyStart(target, settings, workers)
    try:
        yield early
    finally:
        early.close()


@contextlib.contextmanager
def tuning(profile: GpuProfile, policy: Policy, settings: Settings, workers: int | None = None,
           origins: Any = None, budget_s: float | None = None, early: EarlyStart | None = None) -> Iterator[Tuning]:
    """Open the cache (a cache that cannot be opened costs a warning, never the build), find the
    measurers `policy` needs, start the compiler and, with several GPUs, the measuring processes
    of every GPU (each takes seconds to import torch and start CUDA: started here, that overlaps
    planning and the cache lookups); close them all after (a process still starting is killed).
    `origins` (an `origins.Origins`): note there which tier served each cache hit, for the
    provenance. `budget_s`: the measuring processes' tuning budget, as `tune_jobs` takes it.
    `early`: these started before the front end ran (`EarlyStart`), taken when they fit."""
    from ..cache import Cache
    from ..cache.errors import CacheError
    from ..tuner.link import gpu_processes, new_compiler
    taken = early.take(profile, workers, budget_s) if early is not None and policy == Policy.MEASURE else None
    measurers, compiler, procs = taken if taken is not None else ([], None, [])
    cache = None
    try:
        if taken is None and policy == Policy.MEASURE:
            from ..tuner.cuda_measure import local_measurers
            measurers = local_measurers(profile)
        try:
            cache = Cache.open(settings)
        except (CacheError, OSError) as exc:
            sys.stderr.write(f"warning: the XG cache is unavailable ({exc}); building without it\n")
        if cache is not None and origins is not None:
            from .origins import Recording
            cache = Recording(cache, origins)
        if compiler is not None:
            compiler.cache = cache      # started early without one; set before its first compile
        else:
            compiler = new_compiler(profile, cache, workers)
            if measurers:       # their start-up overlaps planning and the cache lookups
                procs = gpu_processes(measurers, cache, profile, policy, budget_s, compiler)   # first: the
                compiler.start()        # measuring processes' torch import is on the critical path
        yield Tuning(profile, policy, cache, measurers, compiler, procs)
    finally:
        _close(procs, compiler)
        if cache is not None:
            cache.close()


@contextlib.contextmanager
def gpu_lease(measurers: list) -> Iterator[None]:
    """Hold this host's GPUs while measuring: a build system may start several tuning actions at
    once, and two measurements sharing a GPU would time each other."""
    if not measurers:
        yield
        return
    path = Path(tempfile.gettempdir()) / "xg-gpu-measure.lock"
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
