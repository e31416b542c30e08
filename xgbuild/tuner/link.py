"""Tuning and linking: an engine's kernel table from its graph and the tuner's winners.

`tune_jobs` orchestrates a build's tuning: it looks each job up in the cache, compiles ahead in a
thread of its own (each missed job's first wave, then the generic variants), starts the GPUs'
measuring processes when there are several (`gpu_processes`), hands the jobs left to
`dispatch.Dispatch`, which spreads them over the GPUs, and has the measured winners written to the
cache (`writer.WinnerWriter`) before the build links. `build_kernels` plans, tunes, compiles the
winners (`compile_winners`) and assembles the table.

Per job two variants are compiled for the target's arch: the tuned one (the winner's config, with
the assumptions of the tuning shape) and the generic one (a default config assuming nothing), so
an engine runs at any size and layout, fast at the shapes it was tuned for. The table and the
cubin/PTX files are a pure function of the graph, the target and the winners.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from queue import SimpleQueue
from dataclasses import dataclass, field
from typing import Any

from ..compiler.codegen.schedule import ScheduleError
from ..compiler.codegen.spec import Binding
from ..compiler.codegen.launch_abi import Variant
from ..compiler.codegen.templates import emit
from ..compiler.frontend.codes import KERNEL_COMPILE, NO_GPU_CODE, NO_TUNED_KERNEL
from ..compiler.frontend.diagnostics import plain_error
from ..compiler.ir.graph import Graph
from ..hw import GpuProfile
from .dispatch import Dispatch
from .jobs import Job, plan, tuning_env
from .policy import Policy
from .progress import TuneProgress
from .space import default_config
from .tuner import Compiler, Measurer, Tuner, TuneError, Winner
from .writer import WinnerWriter


@dataclass
class KernelTable:
    kernels: list[dict]                  # manifest entries, one per job
    launches: list[dict]                 # manifest entries, one per kernel launch, in order
    files: dict[str, bytes]              # archive path -> cubin / PTX bytes
    stats: dict = field(default_factory=dict)


def plan_jobs(graph: Graph, dims: dict[str, int] | None, world: int = 1) -> tuple[list[Job], list[tuple[str, Binding]]]:
    """The program's tuning jobs and launches at the tuning shape (one rank's pieces of it when the
    graph is planned for `world` GPUs), or a CompileError naming what has no GPU code."""
    try:
        return plan(graph, tuning_env(graph, dims), world)
    except ScheduleError as exc:
        raise plain_error(NO_GPU_CODE, what="this program", detail=exc) from None


def tune_jobs(jobs: list[Job], profile: GpuProfile, *, policy: Policy = Policy.CACHE, cache: Any = None,
              measurers: list[Measurer] | None = None, compiler: Compiler | None = None,
              progress: bool | str | TuneProgress = False, budget_s: float | None = None,
              gpu_procs: list | None = None, timeline: dict | None = None) -> dict[str, Winner]:
    """A winner per job (by ident). Jobs fan out over the measurers, one thread per local GPU, in
    job order; when measuring, cache hits are settled first and a background thread compiles
    ahead: each job's first candidates, queued behind the jobs the GPUs are on (`Tuner.prefetch`).
    `progress`: draw a bar (True), write JSON events on stderr ("json") or report to a `TuneProgress`.
    `gpu_procs`: the measuring processes of the GPUs when the caller started them (and closes
    them: `context.tuning`); otherwise they are started, and closed, here. A process for every
    measurer: they measure and this process hands out jobs and records the winners (`Dispatch`:
    each job goes once the first candidate of its wave is compiled, made ready while the process
    measures the one before); for some only (a test's), measurers[0] measures here too. When every
    process gave up with jobs left, the build fails (TuneError). `timeline`: filled, when
    measuring, with each GPU's timeline (`Dispatch.timelines`: by the GPU's name, as
    `search["gpu"]` gives it)."""
    tuners = [Tuner(profile, policy=policy, cache=cache, measurer=m, budget_s=budget_s, compiler=compiler)
              for m in (measurers or [None])]
    for t in tuners[1:]:                        # one build: the seeds and compiles ahead are shared
        t.seeds, t._prefetched, t._neighbours_lock = tuners[0].seeds, tuners[0]._prefetched, tuners[0]._neighbours_lock
    winners: dict[str, Winner] = {}
    bar = TuneProgress.of(len(jobs), progress)
    measuring = policy == Policy.MEASURE and measurers and compiler is not None
    with bar:
        for t in tuners:
            t.events = bar.event
        queue: list[tuple[int, Job]] = []
        stop = threading.Event()
        # The misses go to the thread compiling ahead as the lookups find them: the first jobs'
        # waves, which every GPU waits for, start compiling while the other jobs are looked up.
        misses: SimpleQueue = SimpleQueue()

        def ahead() -> None:
            seen = False
            while (item := misses.get()) is not None:
                seen = True
                if stop.is_set():
                    return
                try:        # (what a measuring process needs it finds in the cache)
                    tuners[0].prefetch(item[1], priority=item[0])
                except Exception:  # noqa: BLE001 (compiling ahead is an optimisation: measure() retries)
                    pass
            for i, job in enumerate(jobs if seen else ()):      # the generic variants the engine links
                if stop.is_set():
                    return
                try:
                    cfg = default_config(job.problem)
                    compiler.submit(emit(job.spec, cfg, Variant.generic()), cfg["num_warps"], cfg["num_stages"],
                                    priority=len(jobs) + i)
                except Exception:  # noqa: BLE001 (compile_winners compiles it again and reports)
                    pass

        fetcher = threading.Thread(target=ahead, daemon=True) if measuring else None
        if fetcher is not None:
            fetcher.start()
        try:
            for i, job in enumerate(jobs):
                if measuring:           # hits first: the GPUs then see only the jobs they must measure
                    hit = tuners[0].from_cache(job, tuners[0].key(job))
                    if hit is not None:
                        winners[job.ident] = hit
                        bar.advance(job.ident, hit.source, hit.ms)
                        continue
                    misses.put((i, job))
                queue.append((i, job))
        except BaseException:
            stop.set()
            raise
        finally:
            misses.put(None)
            if fetcher is not None and stop.is_set():
                fetcher.join()
        # With several GPUs each measures from a process of its own, started by the caller
        # (`context.tuning`) or now; this process then only looks up, compiles ahead and hands
        # the jobs out. One GPU (or processes for some of them only) measures from here.
        own = gpu_procs is None
        procs: list = []
        if measuring and queue:
            procs = gpu_processes(measurers, cache, profile, policy, budget_s, compiler) if own else list(gpu_procs)
        dispatch = Dispatch(tuners, procs, queue, winners, bar, bool(measuring))

        # Measured winners reach the cache from a thread of their own: no GPU waits on SQLite.
        writer = WinnerWriter(cache) if measuring and cache is not None else None
        for t in tuners:
            t.writer = writer
        t_tune = time.perf_counter()
        try:
            dispatch.run()
        finally:
            stop.set()
            if fetcher is not None:
                fetcher.join()
            tuners[0]._prefetched.clear()
            for p in procs if own else ():
                p.close()
            bar.tune_s = time.perf_counter() - t_tune
            if timeline is not None and measuring:
                timeline.update(dispatch.timelines())
            for t in tuners:
                t.writer = None
            if writer is not None:
                try:
                    writer.close()          # every winner written before the build links
                except BaseException as exc:  # noqa: BLE001 (the build's error, after any earlier one)
                    dispatch.errors.append(exc)
        dispatch.raise_failure(len(jobs))
    if dispatch.missing:
        raise TuneError(f"--tune=strict: {len(dispatch.missing)} of {len(jobs)} jobs have no cached winner for "
                        f"{profile.name}:\n  " + "\n  ".join(dispatch.missing)
                        + f"\n  = help: measure them with --tune=measure on {profile.name} hosts (the winners "
                        "then reach every build through the XG cache), or build with --tune=cache")
    return winners


def gpu_processes(measurers: list | None, cache: Any, profile: GpuProfile, policy: Policy, budget_s: float | None,
                   compiler: Compiler) -> list:
    """A measuring process for each local GPU when there are several (`gpu_procs`): threads of one
    process share its interpreter lock, which GPU 0 measuring here would share with the lookups,
    the compiles' coordination and the dispatch. None for one GPU (measured here: no process to
    start), or for measurers of another kind."""
    return measuring_processes(measurers, getattr(cache, "settings", None), profile, policy, budget_s,
                               compiler.workers)


def measuring_processes(measurers: list, settings: Any, profile: GpuProfile, policy: Policy,
                        budget_s: float | None, workers: int) -> list:
    """`gpu_processes` with the settings given: each process opens the cache of `settings` and
    compiles in its share of `workers` processes."""
    from ..settings import tune_in_process
    from .cuda_measure import CudaMeasurer
    if not measurers or len(measurers) < 2 or not all(isinstance(m, CudaMeasurer) for m in measurers) \
            or tune_in_process():
        return []
    from .gpu_procs import GpuProcess
    share = max(1, workers // len(measurers))
    return [GpuProcess(m.device_index, settings, profile, policy, budget_s, share) for m in measurers]


def compile_winners(jobs: list[Job], winners: dict[str, Winner], compiler: Compiler
                    ) -> tuple[dict[str, dict], dict[str, bytes]]:
    """Each job's manifest entry (its tuned and generic variants) and the cubin/PTX files they name."""
    arch = compiler.arch
    pending = []
    for job in jobs:
        w = winners[job.ident]
        generic_cfg = default_config(job.problem)
        for cfg, variant in ((w.config, job.fast_variant(w.config)), (generic_cfg, Variant.generic())):
            try:
                em = emit(job.spec, cfg, variant)
            except NotImplementedError as exc:
                raise plain_error(NO_GPU_CODE, what=f"kernel {job.spec.name}", detail=exc) from None
            pending.append((job, cfg, variant, em, compiler.submit(em, cfg["num_warps"], cfg["num_stages"])))
    entries: dict[str, dict] = {}
    files: dict[str, bytes] = {}
    for job, cfg, variant, em, fut in pending:
        try:
            kb, ptx = fut.result()
        except Exception as exc:  # noqa: BLE001
            text = [x for x in str(exc).splitlines() if x.strip()] or [type(exc).__name__]
            raise plain_error(KERNEL_COMPILE, name=job.spec.name, arch=arch, detail=f"{text[-1]} ({text[0]})") from None
        entry = entries.setdefault(job.ident, {
            "id": job.ident, "name": job.spec.name, "kind": job.spec.kind, "spec": job.spec.canonical(),
            "tuning": {**winners[job.ident].to_json(), "shape": job.shape_part()["sizes"]},
            "variants": []})
        # Files are named by their content: jobs whose kernels compiled to the same bytes (one
        # kernel at many sizes) store them once; an engine of 192 such matmuls held 53 MB of
        # copies, which read as a decompression bomb (110x).
        cubin_sha, ptx_sha = hashlib.sha256(kb.cubin).hexdigest(), hashlib.sha256(ptx.encode()).hexdigest()
        cubin_path = f"kernels/{job.spec.name}.{cubin_sha[:16]}.sm{arch}.cubin"
        ptx_path = f"kernels/{job.spec.name}.{ptx_sha[:16]}.sm{arch}.ptx"
        files[cubin_path] = kb.cubin
        files[ptx_path] = ptx.encode()
        entry["variants"].append({
            "variant": variant.to_json(), "config": cfg, "params": [list(p) for p in em.params],
            "div16": em.div16, **kb.metadata(),
            "cubin": cubin_path, "cubin_sha256": cubin_sha, "ptx": ptx_path, "ptx_sha256": ptx_sha})
    return entries, files


def assemble(jobs: list[Job], launches: list[tuple[str, Binding]], entries: dict[str, dict],
             files: dict[str, bytes], stats: dict | None = None) -> KernelTable:
    """The kernel table: a pure function of the plan and the compiled winners."""
    missing = [job.ident for job in jobs if job.ident not in entries]
    if missing:
        raise plain_error(NO_TUNED_KERNEL, missing=len(missing), total=len(jobs),
                          jobs=", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""),
                          help="were the tuning results made from another version of this program?")
    kernels = [entries[job.ident] for job in jobs]
    named = {v[kind] for k in kernels for v in k["variants"] for kind in ("cubin", "ptx")}
    table_launches = [{"extern": b} if ident == "extern" else {"kernel": ident, "binding": b.to_json()}
                      for ident, b in launches]
    return KernelTable(kernels, table_launches, {p: b for p, b in files.items() if p in named}, dict(stats or {}))


def new_compiler(profile: GpuProfile, cache: Any, workers: int | None) -> Compiler:
    """The kernel compiler for the target's arch: `workers` processes (default: one per CPU this
    process may run on; Triton's compiles are CPU-bound and single-threaded)."""
    return Compiler(profile.sm, cache, workers or host_cpus())


def host_cpus() -> int:
    """The CPUs this process may use (its affinity mask, as a container or `taskset` sets it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def build_kernels(graph: Graph, profile: GpuProfile, *, policy: Policy = Policy.CACHE,
                  dims: dict[str, int] | None = None, cache: Any = None, measurers: list[Measurer] | None = None,
                  workers: int | None = None, progress: bool = False, budget_s: float | None = None,
                  world: int = 1, compiler: Compiler | None = None, gpu_procs: list | None = None) -> KernelTable:
    """Plan, tune, compile and assemble a graph's kernel table. `compiler`: one the caller owns
    (and closes); otherwise one is made for this call."""
    t0 = time.perf_counter()
    jobs, launches = plan_jobs(graph, dims, world)
    own = compiler is None
    compiler = compiler or new_compiler(profile, cache, workers)
    try:
        bar = TuneProgress.of(len(jobs), progress)
        timeline: dict[str, dict] = {}
        winners = tune_jobs(jobs, profile, policy=policy, cache=cache, measurers=measurers, compiler=compiler,
                            progress=bar, budget_s=budget_s, gpu_procs=gpu_procs, timeline=timeline)
        entries, files = compile_winners(jobs, winners, compiler)
    finally:
        if own:
            compiler.close()
    sources = [w.source for w in winners.values()]
    stats = {"jobs": len(jobs), "launches": len(launches), "seconds": time.perf_counter() - t0,
             "compiled": compiler.compiled, "compile_cache_hits": compiler.hits,
             "measured": sources.count("measured"), "cache": sources.count("cache"),
             "predicted": sources.count("predicted"), "compile_shared": compiler.shared,
             "compile_s": round(compiler.seconds, 3), "tune_s": round(bar.tune_s, 3),
             "gpus": len(measurers or [])}
    searched = [w.search for w in winners.values() if w.source == "measured" and w.search]
    if searched:
        stats["search"] = {k: sum(int(s.get(k, 0)) for s in searched)
                           for k in ("candidates", "compiled", "measured", "pruned", "failed", "seeded")}
        stats["search_s"] = {k: round(sum(float(s.get(k, 0)) for s in searched), 3)
                             for k in ("seconds", "measuring_s", "waiting_s", "reference_s")}
        by_gpu: dict[str, list[dict]] = {}
        for s in searched:
            if isinstance(s.get("gpu"), str):
                by_gpu.setdefault(s["gpu"], []).append(s)
        if by_gpu:                  # how the jobs spread over the host's GPUs: jobs and seconds each
            stats["by_gpu"] = {g: {"jobs": len(v), **{k: round(sum(float(s.get(k, 0)) for s in v), 3)
                                                     for k in ("seconds", "measuring_s", "waiting_s")}}
                               for g, v in sorted(by_gpu.items())}
    if gpu_procs:
        stats["gpu_start_s"] = [p.ready_s for p in gpu_procs]
    for g, line in sorted(timeline.items()):    # and when each was up, at work, and idle between jobs
        stats.setdefault("by_gpu", {}).setdefault(g, {}).update(line)
    return assemble(jobs, launches, entries, files, stats)
