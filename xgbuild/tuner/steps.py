"""The tuner's steps as commands run them: tune a whole program, or jobs -> shards -> results -> link.

`xgc --out` runs everything in one process (`link.kernels_for`). A build system runs the steps as
separate cached actions (see `jobfile` for the files between them): `write_shards` once per engine,
`tune_shard` once per shard (in parallel, each cached on its own inputs), `link_results` once.
Each step opens the XG cache (local store and remote tier, from the settings) only if it needs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from ..hw import GpuProfile, load_profile
from ..packager.archive import atomic_write
from .jobfile import (JobFileError, canonical_bytes, job_from_json, read_results, read_shard, result_doc,
                      shard_docs)


@contextlib.contextmanager
def tuning_context(profile: GpuProfile, policy: str) -> Iterator[tuple[Any, list]]:
    """(cache or None, measurers) for tuning under `policy`; a cache that cannot be opened costs a
    warning, never the build."""
    from ..cache import Cache
    from ..cache.errors import CacheError
    from ..settings import Settings
    measurers: list = []
    if policy == "measure":
        from .cuda_measure import local_measurers
        measurers = local_measurers(profile)
    try:
        cache = Cache.open(Settings.from_env())
    except (CacheError, OSError) as exc:
        sys.stderr.write(f"warning: the XG cache is unavailable ({exc}); building without it\n")
        cache = None
    try:
        yield cache, measurers
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


def write_shards(compiled: Any, dims: dict[str, int], shards: int, paths: list[Path]) -> int:
    """Write the program's jobs into `len(paths)` == `shards` shard files; the number of jobs."""
    from .link import plan_jobs
    if len(paths) != shards:
        raise JobFileError(f"{shards} shards need {shards} output files, got {len(paths)}")
    jobs, _ = plan_jobs(compiled.optimized.main, dims, compiled.num_gpu)
    for path, doc in zip(paths, shard_docs(jobs, compiled.target, shards)):
        atomic_write(path, canonical_bytes(doc))
    return len(jobs)


def tune_shard(shard: Path, out: Path, policy: str, *, workers: int | None = None, progress: bool = False,
               budget_s: float | None = None) -> dict:
    """Tune and compile one shard's jobs into a result file; counts of what happened."""
    target, raw = read_shard(shard)
    profile = load_profile(target)
    arch = profile.sm
    stats = {"jobs": len(raw), "measured": 0, "cache": 0, "predicted": 0, "compiled": 0, "compile_cache_hits": 0}
    if not raw:
        # Nothing to tune: answer without importing torch or Triton (a build has many such shards).
        atomic_write(out, canonical_bytes(result_doc(target, arch, {}, {})))
        return stats
    from .link import compile_winners, tune_jobs
    from .tuner import Compiler
    jobs = [job_from_json(d) for d in raw]
    t0 = time.perf_counter()
    with tuning_context(profile, policy) as (cache, measurers):
        compiler = Compiler(arch, cache, workers or min(8, os.cpu_count() or 1))
        try:
            with gpu_lease(measurers):
                winners = tune_jobs(jobs, profile, policy=policy, cache=cache, measurers=measurers,
                                    compiler=compiler, progress=progress, budget_s=budget_s)
            entries, files = compile_winners(jobs, winners, compiler)
        finally:
            compiler.close()
    atomic_write(out, canonical_bytes(result_doc(target, arch, entries, files)))
    sources = [w.source for w in winners.values()]
    stats.update({k: sources.count(k) for k in ("measured", "cache", "predicted")},
                 compiled=compiler.compiled, compile_cache_hits=compiler.hits, seconds=time.perf_counter() - t0)
    return stats


def link_results(compiled: Any, dims: dict[str, int], results: list[Path]) -> Any:
    """The kernel table from result files, nothing tuned or compiled: a pure function of the program
    and the winners in `results`."""
    from .link import assemble, plan_jobs
    profile = load_profile(compiled.target)
    entries, files = read_results(results, compiled.target, profile.sm)
    jobs, launches = plan_jobs(compiled.optimized.main, dims, compiled.num_gpu)
    sources = [entries[j.ident]["tuning"]["source"] for j in jobs if j.ident in entries]
    stats = {"jobs": len(jobs), "launches": len(launches), "seconds": 0.0, "compiled": 0, "compile_cache_hits": 0,
             **{k: sources.count(k) for k in ("measured", "cache", "predicted")}}
    return assemble(jobs, launches, entries, files, stats)


def tune_program(compiled: Any, policy: str, dims: dict[str, int], *, workers: int | None = None,
                 progress: bool = False, budget_s: float | None = None) -> list[tuple[Any, Any]]:
    """Tune every job of a program without linking (winners go to the cache): (job, winner) pairs."""
    from .link import plan_jobs, tune_jobs
    from .tuner import Compiler
    profile = load_profile(compiled.target)
    jobs, _ = plan_jobs(compiled.optimized.main, dims, compiled.num_gpu)
    with tuning_context(profile, policy) as (cache, measurers):
        compiler = Compiler(profile.sm, cache, workers or min(8, os.cpu_count() or 1))
        try:
            with gpu_lease(measurers):
                winners = tune_jobs(jobs, profile, policy=policy, cache=cache, measurers=measurers,
                                    compiler=compiler, progress=progress, budget_s=budget_s)
        finally:
            compiler.close()
    return [(job, winners[job.ident]) for job in jobs]
