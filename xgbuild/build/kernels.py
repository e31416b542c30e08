"""Tune and link a program's kernels in one process (what `xgc --out` and `xg` do), or tune them
only (`xgbuild tune`): plan the jobs, tune each under the policy through the XG cache, compile the
winners, assemble the kernel table.
"""

from __future__ import annotations

import sys
from typing import Any

from ..hw import GpuProfile
from ..settings import Settings
from ..tuner.link import KernelTable, build_kernels, plan_jobs, tune_jobs
from ..tuner.policy import Policy
from .context import gpu_lease, tuning


def kernels_for(program: Any, profile: GpuProfile, policy: Policy, settings: Settings,
                dims: dict[str, int] | None = None, workers: int | None = None,
                progress: bool | str = False, origins: Any = None, early: Any = None) -> KernelTable:
    """The kernel table for a compiled (or imported) program on `profile`, tuned under `policy`
    through the settings' cache: what an engine links. `origins`, `early`: see `context.tuning`."""
    with tuning(profile, policy, settings, workers, origins, early=early) as t, gpu_lease(t.measurers):
        return build_kernels(program.optimized.main, profile, policy=policy, dims=dims, cache=t.cache,
                             world=getattr(program, "num_gpu", 1), measurers=t.measurers, compiler=t.compiler,
                             gpu_procs=t.gpu_procs,
                             progress=progress if progress == "json" else progress and sys.stderr.isatty())


def tune_program(program: Any, profile: GpuProfile, policy: Policy, settings: Settings, dims: dict[str, int], *,
                 workers: int | None = None, progress: bool | str = False,
                 budget_s: float | None = None) -> list[tuple[Any, Any]]:
    """Tune every job of a program without linking (winners go to the cache): (job, winner) pairs."""
    jobs, _ = plan_jobs(program.optimized.main, dims, program.num_gpu)
    with tuning(profile, policy, settings, workers, budget_s=budget_s) as t:
        with gpu_lease(t.measurers):
            winners = tune_jobs(jobs, profile, policy=policy, cache=t.cache, measurers=t.measurers,
                                compiler=t.compiler, progress=progress, budget_s=budget_s, gpu_procs=t.gpu_procs)
    return [(job, winners[job.ident]) for job in jobs]
