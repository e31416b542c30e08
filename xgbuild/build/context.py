"""What a tuning step runs with: the XG cache (local store and remote tier, from the settings),
this host's measurers, a kernel compiler, and a lease on the host's GPUs while measuring.
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
import tempfile
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
    gpu_procs: list = ()    # tuner.gpu_procs.GpuProcess: GPUs 1.. of this host, measuring from a process each


@contextlib.contextmanager
def tuning(profile: GpuProfile, policy: Policy, settings: Settings, workers: int | None = None,
           origins: Any = None, budget_s: float | None = None) -> Iterator[Tuning]:
    """Open the cache (a cache that cannot be opened costs a warning, never the build), find the
    measurers `policy` needs, start the compiler and, with several GPUs, the measuring processes
    of GPUs 1.. (each takes seconds to import torch and start CUDA: started here, that overlaps
    planning and the cache lookups); close them all after (a process still starting is killed).
    `origins` (an `origins.Origins`): note there which tier served each cache hit, for the
    provenance. `budget_s`: the measuring processes' tuning budget, as `tune_jobs` takes it."""
    from ..cache import Cache
    from ..cache.errors import CacheError
    from ..tuner.link import gpu_processes, new_compiler
    measurers: list = []
    if policy == Policy.MEASURE:
        from ..tuner.cuda_measure import local_measurers
        measurers = local_measurers(profile)
    try:
        cache = Cache.open(settings)
    except (CacheError, OSError) as exc:
        sys.stderr.write(f"warning: the XG cache is unavailable ({exc}); building without it\n")
        cache = None
    if cache is not None and origins is not None:
        from .origins import Recording
        cache = Recording(cache, origins)
    try:
        compiler = new_compiler(profile, cache, workers)
        procs: list = []
        try:
            if measurers:       # their start-up overlaps planning and the cache lookups
                procs = gpu_processes(measurers, cache, profile, policy, budget_s, compiler)   # first: the
                compiler.start()        # measuring processes' torch import is on the critical path
            yield Tuning(profile, policy, cache, measurers, compiler, procs)
        finally:
            for p in procs:
                p.close()
            compiler.close()
    finally:
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
