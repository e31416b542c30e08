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


@contextlib.contextmanager
def tuning(profile: GpuProfile, policy: Policy, settings: Settings, workers: int | None = None,
           origins: Any = None) -> Iterator[Tuning]:
    """Open the cache (a cache that cannot be opened costs a warning, never the build), find the
    measurers `policy` needs, start the compiler; close them all after. `origins` (an
    `origins.Origins`): note there which tier served each cache hit, for the provenance."""
    from ..cache import Cache
    from ..cache.errors import CacheError
    from ..tuner.link import new_compiler
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
        if measurers:
            compiler.start()        # the workers' start-up overlaps planning and the cache lookups
        try:
            yield Tuning(profile, policy, cache, measurers, compiler)
        finally:
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
