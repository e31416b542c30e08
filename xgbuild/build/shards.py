"""The tuning as a build system runs it: separate cached steps (see `tuner/jobfile.py` for the
files between them). `write_shards` once per engine, `tune_shard` once per shard (in parallel,
each cached on its own inputs), `link_results` once. A step opens the XG cache only if it needs it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..hw import GpuProfile
from ..packager.archive import atomic_write
from ..settings import Settings
from ..tuner.jobfile import (JobFileError, canonical_bytes, job_from_json, read_results, read_shard, result_doc,
                             shard_docs)
from ..tuner.policy import Policy
from .target import target_profile

# tuner.link is imported where it is used: it loads torch and Triton, which a shard with nothing
# to tune never needs.


def write_shards(program: Any, dims: dict[str, int], shards: int, paths: list[Path]) -> int:
    """Write the program's jobs into `len(paths)` == `shards` shard files; the number of jobs."""
    from ..tuner.link import plan_jobs
    if len(paths) != shards:
        raise JobFileError(f"{shards} shards need {shards} output files, got {len(paths)}")
    jobs, _ = plan_jobs(program.optimized.main, dims, program.num_gpu)
    for path, doc in zip(paths, shard_docs(jobs, program.target, shards)):
        atomic_write(path, canonical_bytes(doc))
    return len(jobs)


def tune_shard(shard: Path, out: Path, policy: Policy, settings: Settings, *, workers: int | None = None,
               progress: bool = False, budget_s: float | None = None) -> dict:
    """Tune and compile one shard's jobs into a result file; counts of what happened. The shard
    names its target: its profile is loaded here, from the settings' hw directory."""
    target, raw = read_shard(shard)
    profile = target_profile(target, settings)
    arch = profile.sm
    stats = {"jobs": len(raw), "measured": 0, "cache": 0, "predicted": 0, "compiled": 0, "compile_cache_hits": 0}
    if not raw:
        # Nothing to tune: answer without importing torch or Triton (a build has many such shards).
        atomic_write(out, canonical_bytes(result_doc(target, arch, {}, {})))
        return stats
    from ..tuner.link import compile_winners, tune_jobs
    from .context import gpu_lease, tuning
    jobs = [job_from_json(d) for d in raw]
    t0 = time.perf_counter()
    with tuning(profile, policy, settings, workers, budget_s=budget_s) as t:
        with gpu_lease(t.measurers):
            winners = tune_jobs(jobs, profile, policy=policy, cache=t.cache, measurers=t.measurers,
                                compiler=t.compiler, progress=progress, budget_s=budget_s, gpu_procs=t.gpu_procs)
        entries, files = compile_winners(jobs, winners, t.compiler)
    atomic_write(out, canonical_bytes(result_doc(target, arch, entries, files)))
    sources = [w.source for w in winners.values()]
    stats.update({k: sources.count(k) for k in ("measured", "cache", "predicted")},
                 compiled=t.compiler.compiled, compile_cache_hits=t.compiler.hits, seconds=time.perf_counter() - t0)
    return stats


def link_results(program: Any, profile: GpuProfile, dims: dict[str, int], results: list[Path]) -> Any:
    """The kernel table (`tuner.link.KernelTable`) from result files, nothing tuned or compiled: a
    pure function of the program and the winners in `results`."""
    from ..tuner.link import assemble, plan_jobs
    entries, files = read_results(results, program.target, profile.sm)
    jobs, launches = plan_jobs(program.optimized.main, dims, program.num_gpu)
    sources = [entries[j.ident]["tuning"]["source"] for j in jobs if j.ident in entries]
    stats = {"jobs": len(jobs), "launches": len(launches), "seconds": 0.0, "compiled": 0, "compile_cache_hits": 0,
             **{k: sources.count(k) for k in ("measured", "cache", "predicted")}}
    return assemble(jobs, launches, entries, files, stats)
