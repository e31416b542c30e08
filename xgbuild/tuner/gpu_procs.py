"""Measuring on several GPUs of a host: one process per GPU, each with its own tuner.

Threads measuring in one process share its interpreter lock, and a candidate's measurement is
as much Python (binding, launching, timing runs, checking) as GPU time for most kernels: two
GPUs in one process tuned 1.3-1.4x the jobs per minute of one. Here each GPU gets a process
(`workers.Worker`, `CUDA_VISIBLE_DEVICES` naming its GPU alone) that keeps a `Tuner`, a
`CudaMeasurer`, a compile pool (its share of the host's CPUs) and the XG cache open between jobs;
the parent hands it jobs one at a time, in order, and gets the winners back. Cubins meet in the
shared XG cache (and Triton's), so the parent links the winners without compiling them again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..settings import visible_device, visible_devices
from .jobs import Job
from .tuner import Compiler, TuneError, Tuner, Winner
from .workers import Worker, WorkerDied

_STATE: dict[str, Tuner] = {}       # in a measuring process: its tuner, made by the first call


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


def tune_here(settings: Any, profile_ref: tuple, policy: str, budget_s: float | None, workers: int,
              job: Job | None, priority: float) -> Winner | None:
    """Runs in a measuring process: `job`'s winner, measured on this process's one GPU (None: only
    start the tuner, its GPU, cache and compile workers)."""
    tuner = _STATE.get("tuner")
    if tuner is None:
        profile = _profile(*profile_ref)
        from .cuda_measure import local_measurers
        cache = None
        if settings is not None:
            from ..cache import Cache
            cache = Cache.open(settings)
        measurers = local_measurers(profile)
        if not measurers:
            raise TuneError(f"the measuring process for GPU {','.join(visible_devices())} finds no "
                            f"{profile.name} GPU")
        # The build's own process compiles every job's first candidates into the shared cache;
        # this pool compiles what a job here needs beyond them. Started now, with the process,
        # and not at the first such candidate (its workers' start then held that job seconds).
        compiler = Compiler(profile.sm, cache, workers)
        compiler.start()
        tuner = _STATE["tuner"] = Tuner(profile, policy=policy, cache=cache, measurer=measurers[0],
                                        budget_s=budget_s, compiler=compiler)
    return None if job is None else tuner.tune(job, priority=priority, looked_up=True)


class GpuProcess:
    """One GPU's measuring process, as `tune_jobs` drives it: `tune(job, priority)` -> Winner."""

    def __init__(self, device_index: int, settings: Any, profile: Any, policy: str, budget_s: float | None,
                 workers: int) -> None:
        self.device_index = device_index
        hw_dir = getattr(settings, "hw_dir", None)
        self._args = (settings, (profile.name, hw_dir, profile.to_dict()), str(policy), budget_s, max(1, workers))
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
                self._worker.call(tune_here, (*self._args, None, 0))
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

    def tune(self, job: Job, priority: float = 0, looked_up: bool = True) -> Winner:
        self.started()
        with self._lock:
            try:
                return self._worker.call(tune_here, (*self._args, job, priority))
            except WorkerDied as exc:
                raise GpuUnavailable(f"GPU {self.device_index}'s measuring process died: {exc}") from None

    def close(self) -> None:
        """Stop the process; one still starting (the other GPUs took every job first) is killed
        rather than waited for."""
        if self._ready.is_alive():
            self._worker.proc.kill()
        self._ready.join()
        self._worker.close()
