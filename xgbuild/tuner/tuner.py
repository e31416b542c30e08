"""The tuner: a winning config per job, from measurement, the cache or the cost model.

Policies (`--tune`):
- `predict`: the roofline model over the `hw/` profile picks; nothing is read from the cache.
- `cache` (default): a winner measured earlier on the target GPU model (local or remote cache),
  else the model's pick, marked `predicted`.
- `measure`: the cache, else measure every candidate on a local GPU of the target model. Without
  one it fails: a measurement is never claimed for a GPU that was not there.
- `strict`: the cache only; any miss fails, naming the jobs.

A measured candidate that fails to compile or whose outputs differ from the float64 CPU reference
beyond the dtype's tolerance scores `inf`: a wrong kernel never wins. Winners go to the cache under
the job's key; compiled cubins go to the cache under their source digest and arch, so a warm build
compiles nothing.
"""

from __future__ import annotations

import concurrent.futures as futures
import hashlib
import math
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, Protocol

import torch

from ..cache.canonical import thaw
from ..cache.errors import CacheError
from ..cache.forensics import Neighbours, miss_report
from ..cache.keys import CacheKey
from ..compiler.codegen.emitter import Emitted
from ..compiler.codegen.launch_abi import Variant
from ..compiler.codegen.templates import emit, template
from ..compiler.codegen.templates.base import config_key
from ..errors import XGError
from ..hw import GpuProfile
from ..runtime.cuda import KernelBinary
from .compile_job import binary_of, compile_job
from .gate import (ILL_CONDITIONED_SLACK, TOLERANCE, EagerError, agrees, disagrees,  # noqa: F401 (re-exported)
                   gate_dtypes, rel_error)
from .jobdata import JobData
from .jobs import Job
from .policy import Policy
from .predict import rank
from .search import Candidate, Search, exhaustive, first_wave
from .space import candidates, default_config

SPACE_VERSION = 3
MEASURE_POLICY = {"objective": "median-ms", "warmup": 5, "reps": 50, "l2-flush": True}
COMPILE_NICE = 10          # compile workers' niceness: the measuring loops (host-bound launches) keep their CPUs
# Compiles a job keeps queued from the candidate it measures on (those its bound has not ruled
# out), and the first wave compiled ahead for each job. A compile takes seconds (ptxas) and a
# measurement milliseconds, so each round trip of waiting costs a compile's latency: a wide first
# wave fills the workers at once; the few past the stop point are the price of not waiting.
LOOKAHEAD = 16



class TuneError(XGError):
    """Tuning could not give every job a winner under the chosen policy."""


class StrictMiss(TuneError):
    """`--tune=strict` found no measured winner for a job; `report` says why (see `explain_miss`)."""

    def __init__(self, ident: str, report: list[str]) -> None:
        super().__init__(f"no cached winner for job {ident}: " + "\n".join(report))
        self.ident = ident
        self.report = report


@dataclass
class Winner:
    config: dict[str, int]
    source: str                      # "measured" | "cache" | "predicted"
    ms: float                        # measured median, or the model's prediction
    key: str                         # the job's cache key digest
    candidates: int = 0
    rejected: dict[str, str] = field(default_factory=dict)   # config -> why it scored inf
    measured_on: str | None = None   # the GPU model a measurement ran on
    search: dict = field(default_factory=dict)      # how a measured job searched (compiled, measured, pruned...)
    timings: list[dict] = field(default_factory=list)   # per candidate: predicted and measured ms (None: not)

    def to_json(self) -> dict:
        out = {"source": self.source, "config": self.config, "ms": round(self.ms, 6), "key": self.key,
               "candidates": self.candidates}
        if self.measured_on:
            out["measured_on"] = self.measured_on
        if self.search:
            # (times and which GPU measured are this build's telemetry, not the engine's: left out)
            out["search"] = {k: v for k, v in self.search.items() if not k.endswith("_s") and k not in ("seconds", "gpu")}
        return out


SEARCH_COUNTS = ("candidates", "compiled", "measured", "pruned", "failed")


def _search_summary(value: Any) -> dict:
    """A cached record's `search` summary as the manifest may carry it: the known counts as
    non-negative ints, `seeded` as a bool, `stopped` as one line of at most 300 characters;
    anything else in it (a record from a remote is untrusted) is left out."""
    if not isinstance(value, dict):
        return {}
    out: dict = {k: value[k] for k in SEARCH_COUNTS
                 if type(value.get(k)) is int and 0 <= value[k] < 2**31}
    if isinstance(value.get("seeded"), bool):
        out["seeded"] = value["seeded"]
    if isinstance(value.get("stopped"), str):
        out["stopped"] = value["stopped"].splitlines()[0][:300] if value["stopped"] else ""
    return out


class Measurer(Protocol):
    gpu_name: str

    def measure(self, job: Job, variant: Variant, config: dict, emitted: Emitted, binary: KernelBinary,
                data: "JobData") -> tuple[float, list[torch.Tensor]]:
        """(median ms, outputs on the CPU) of one candidate on `data`'s inputs."""


# --- compiling ------------------------------------------------------------------------------------

class Compiler:
    """Compiles emitted kernels through the cache (kind `cubin`), in worker processes.

    A kernel asked for twice (two jobs whose kernels differ only in what the source does not
    bake in: sizes passed at run time) is compiled once: requests share one future by cache key.
    `priority` orders the queue (lower first): the tuner compiles the job it is measuring before
    the jobs it compiles ahead for; `release` cancels what is queued and no longer wanted."""

    def __init__(self, arch: int, cache: Any = None, workers: int = 1) -> None:
        self.arch = arch
        self.cache = cache
        self.workers = max(1, workers)
        self._pool: futures.Executor | None = None
        self._lock = threading.Lock()
        self.hits = 0
        self.compiled = 0
        self.shared = 0                 # requests answered by a compile another request started
        self.seconds = 0.0              # worker time spent compiling
        self._known: dict[str, tuple[futures.Future, futures.Future | None]] = {}   # key -> (result, queued)
        self._holders: dict[str, int] = {}

    def key(self, em: Emitted, num_warps: int, num_stages: int) -> CacheKey:
        import hashlib
        return CacheKey(kernel_ir={"source_sha256": hashlib.sha256(em.source.encode()).hexdigest(),
                                   "name": em.name},
                        shapes={}, dtypes={}, gpu_profile={"arch": f"sm_{self.arch}"},
                        search_space={"num_warps": num_warps, "num_stages": num_stages, "div16": em.div16,
                                      "aligned": em.aligned, "signature": em.signature,
                                      "constexprs": em.constexprs},
                        policy={}, kind="cubin")

    def _executor(self) -> futures.Executor:
        with self._lock:
            if self._pool is None:
                if self.workers > 1:
                    from .compile_job import warm
                    from .workers import SubprocessPool
                    self._pool = SubprocessPool(self.workers, nice=COMPILE_NICE, warm=(warm, (self.arch,)))
                else:
                    self._pool = futures.ThreadPoolExecutor(1)
            return self._pool

    def start(self) -> None:
        """Start the compile workers now: a measured build will need them all. Each compiles a
        tiny kernel first (`compile_job.warm`), so the first wave of real compiles, which the GPUs
        wait for, does not pay Triton's start in every worker."""
        pool = self._executor()
        if hasattr(pool, "start"):
            pool.start()

    def submit(self, em: Emitted, num_warps: int, num_stages: int,
               priority: float = 0) -> "futures.Future[tuple[KernelBinary, str]]":
        """The kernel compiled, from the cache when this host made or checked that entry. A cubin
        from the remote (or of unknown origin) is never used as it is: the kernel is compiled here
        and the cached bytes are kept only when they equal this compile (`_settle`)."""
        key = self.key(em, num_warps, num_stages)
        with self._lock:
            known = self._known.get(key.digest)
            if known is not None and not known[0].cancelled():
                self._holders[key.digest] = self._holders.get(key.digest, 0) + 1
                self.shared += 1
                return known[0]
        hit = self.cache.lookup(key) if self.cache is not None else None
        unverified = None
        if hit is not None and not hit.trusted:
            unverified, hit = hit, None
        if hit is not None:
            try:
                kb = KernelBinary.from_metadata(hit.record.value, hit.blobs["cubin"])
                done: futures.Future = futures.Future()
                done.set_result((kb, hit.blobs.get("ptx", b"").decode()))
                self.hits += 1
                return done
            except (KeyError, TypeError, ValueError, UnicodeDecodeError):
                pass          # a record of another shape: compile again and overwrite
        pool = self._executor()
        args = (compile_job, em.source, em.name, em.params, em.constexprs, em.div16, em.aligned, self.arch,
                num_warps, num_stages)
        fut = pool.submit_at(priority, *args) if hasattr(pool, "submit_at") else pool.submit(*args)
        out: futures.Future = futures.Future()
        with self._lock:
            self._known[key.digest] = (out, fut)
            self._holders[key.digest] = 1

        def finish(f: futures.Future) -> None:
            if f.cancelled():
                out.cancel()
                return
            try:
                res = f.result()
            except BaseException as exc:  # noqa: BLE001 (a compile failure is a result: the candidate scores inf)
                out.set_exception(exc)
                return
            try:
                kb, ptx = binary_of(res, em.params), res["ptx"]
            except BaseException as exc:  # noqa: BLE001 (a kernel XG cannot launch is a failed compile)
                out.set_exception(exc)
                return
            with self._lock:
                self.compiled += 1
                self.seconds += res.get("seconds", 0.0)
            if self.cache is not None:
                try:
                    self._settle(key, kb, ptx, unverified)
                except (XGError, CacheError, OSError):
                    pass      # a cache that cannot be written slows the next build, never this one
            out.set_result((kb, ptx))
        fut.add_done_callback(finish)
        return out

    def release(self, em: Emitted, num_warps: int, num_stages: int) -> None:
        """One request for this kernel no longer needs it: the compile is cancelled when it is
        still queued and nothing else asked for it."""
        digest = self.key(em, num_warps, num_stages).digest
        with self._lock:
            held = self._holders.get(digest, 0) - 1
            self._holders[digest] = max(held, 0)
            known = self._known.get(digest)
            if held > 0 or known is None or known[1] is None:
                return
            if known[1].cancel():
                del self._known[digest]

    def _settle(self, key: CacheKey, kb: KernelBinary, ptx: str, unverified: Any) -> None:
        """Record this host's compile. An unchecked cached entry for the same key is kept when
        its cubin, PTX and metadata equal this compile (`remote-verified`), else reported as
        poisoned and replaced by this compile (`re-derived`). The engine links this compile's
        bytes either way: nothing from the remote reaches it unless it is identical."""
        if unverified is None:
            self.cache.store(key, {**kb.metadata(), "origin": "local"}, {"cubin": kb.cubin, "ptx": ptx.encode()})
            return
        theirs, mine = unverified.record, kb.metadata()
        why = None
        if theirs.blobs.get("cubin") is None or theirs.blobs["cubin"].digest != hashlib.sha256(kb.cubin).hexdigest():
            why = "its cubin differs from the one compiled here from the same kernel source"
        elif theirs.blobs.get("ptx") is None or theirs.blobs["ptx"].digest != hashlib.sha256(ptx.encode()).hexdigest():
            why = "its PTX differs from the one compiled here from the same kernel source"
        elif not isinstance(theirs.value, Mapping) or any(thaw(theirs.value).get(k) != v for k, v in mine.items()):
            why = "its launch metadata differs from this host's compile"
        if why is None:
            self.cache.adopt(unverified, "remote-verified")
            return
        self.cache.reject(unverified, why)
        self.cache.store(key, {**kb.metadata(), "origin": "re-derived"}, {"cubin": kb.cubin, "ptx": ptx.encode()})

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


# --- the tuner ------------------------------------------------------------------------------------

class _Fetched(futures.Future):
    """A handed-over wave compile still running in the tuner that handed it (`Tuner.preset`): its
    outcome is fetched when `measure` first needs it, on that thread; when the giver has none
    (`fetch` gives None), the kernel is compiled here (`compile_here()`, a future)."""

    def __init__(self, fetch: Callable[[], Any], compile_here: Callable[[], futures.Future]) -> None:
        super().__init__()
        self._fetch, self._compile_here = fetch, compile_here

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            try:
                got = self._fetch()
                self.set_result((got, "") if got is not None else self._compile_here().result())
            except Exception as exc:  # noqa: BLE001 (a compile failure is a result: the candidate scores inf)
                self.set_exception(exc)
        return super().result(timeout)


class Tuner:
    def __init__(self, profile: GpuProfile, *, policy: Policy | str = Policy.CACHE, cache: Any = None,
                 measurer: Measurer | None = None, budget_s: float | None = None,
                 compiler: Compiler | None = None) -> None:
        try:
            policy = Policy(policy)
        except ValueError:
            raise TuneError(f"unknown tuning policy {policy!r}; use one of {', '.join(Policy)}") from None
        self.profile = profile
        self.policy = policy
        self.cache = cache
        self.measurer = measurer
        self.budget_s = budget_s
        self.compiler = compiler
        self._float32_error = EagerError()
        self._neighbours: Neighbours | None = None
        self._neighbours_lock = threading.Lock()
        self.seeds: dict[str, str] = {}         # kernel name -> this build's first winner (tuners may share it)
        self._prefetched: dict[str, dict] = {}
        self.events: Any = None                 # callable(kind, **fields): progress events
        self.writer: Any = None                 # writer.WinnerWriter: records stored from a thread of its own
        self._memo: dict[tuple[str, str], Any] = {}

    def _as_accurate_as_float32(self, outs: list[torch.Tensor], ref: list[torch.Tensor], data: JobData) -> str | None:
        """None when every output of a 3xTF32 candidate is at least as close to the float64
        reference as float32 eager's; a user asking for float32 gets float32's accuracy or better."""
        bar = self._float32_error(data, ref, getattr(self.measurer, "device", "cpu"))
        for o, r, b in zip(outs, ref, bar):
            err = rel_error(o, r)
            if not err <= b:
                return f"3xTF32 error {err:.3g} > float32's own {b:.3g}"
        return None

    def _disagrees(self, outs: list[torch.Tensor], ref: list[torch.Tensor], dtypes: list[str],
                   data: JobData) -> str | None:
        """`gate.disagrees`, eager's errors on this job's data computed only if an output needs them."""
        device = getattr(self.measurer, "device", "cpu")
        return disagrees(outs, ref, dtypes, lambda: self._float32_error.with_outputs(data, ref, device))

    def _once(self, what: str, job: Job, make: Any) -> Any:
        """`make()` once per job (by ident) and kind of answer: a build asks for a job's search
        space, key and ranking from several places (cache check, progress, compiling ahead,
        measuring), and each costs milliseconds of pruning, ranking and hashing."""
        known = self._memo.get((what, job.ident))
        if known is None:
            known = self._memo[(what, job.ident)] = make()
        return known

    def candidates(self, job: Job) -> list[dict]:
        return self._once("candidates", job, lambda: candidates(job.problem, self.profile))

    def key(self, job: Job) -> CacheKey:
        return self._once("key", job, lambda: CacheKey(
            kernel_ir=job.spec.canonical(), shapes=job.shape_part(), dtypes=[d for d, _ in job.spec.operands],
            gpu_profile=self.profile.to_dict(),
            search_space={"version": SPACE_VERSION, "configs": [config_key(c) for c in self.candidates(job)]},
            policy=MEASURE_POLICY))

    def predicted(self, job: Job) -> tuple[dict, float, int]:
        # Reduced-precision products (3xTF32) are earned by measurement against float32's own
        # error on the job's data, never by the model's say-so.
        cands = [c for c in self.candidates(job) if not c.get("TF32X3")] or [default_config(job.problem)]
        ms, best = rank(job.problem, cands, self.profile)[0]
        return best, ms, len(cands)

    def from_cache(self, job: Job, key: CacheKey) -> Winner | None:
        if self.cache is None:
            return None
        hit = self.cache.lookup(key)
        if hit is None:
            return None
        v = hit.record.value
        try:
            config = {str(k): int(x) for k, x in dict(v["config"]).items()}
            winner = Winner(config, "cache", float(v["ms"]), key.digest, int(v.get("candidates", 0)),
                            measured_on=str(v["measured_on"]))
            winner.search = _search_summary(thaw(v.get("search", {})))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if not hit.trusted:
            # A record from the remote picks among this job's own candidates, or is poisoned. Its
            # timing is not re-measured: a false one can make the build pick a slower candidate,
            # never run code this host did not compile from its own kernel source.
            if config_key(config) not in {config_key(c) for c in self.candidates(job)}:
                self.cache.reject(hit, f"its winning config {config_key(config)[:200]} is not a candidate of "
                                       f"this job's search space")
                return None
            self.cache.adopt(hit, "remote-verified")
        return winner

    def tune(self, job: Job, priority: float = 0, looked_up: bool = False, record: bool = True) -> Winner:
        """`job`'s winner under the policy; `looked_up`: the caller found no cache hit already;
        `record=False`: a measured winner is the caller's to record (`record_winner`)."""
        key = self.key(job)
        if self.policy == "predict":
            return self._predict(job, key)
        hit = None if looked_up else self.from_cache(job, key)
        if hit is not None:
            return hit
        if self.policy == "strict":
            raise StrictMiss(job.ident, self.explain_miss(key))
        if self.policy == "cache" or (self.policy == "measure" and self.measurer is None):
            if self.policy == "measure":
                raise TuneError(f"--tune=measure needs a local {self.profile.name} GPU to measure on, and this "
                                f"host has none; use --tune=cache or --tune=predict, or build on a "
                                f"{self.profile.name} host")
            return self._predict(job, key)
        winner = self.measure(job, key, priority)
        if record:
            self.record_winner(key, winner)
        return winner

    def record_winner(self, key: CacheKey, winner: Winner) -> None:
        """Cache a measured winner under its job's key (through `writer` when there is one)."""
        self._record(key, {"how": "measured", "origin": "measured", "config": winner.config, "ms": winner.ms,
                           "measured_on": winner.measured_on, "candidates": winner.candidates,
                           "rejected": winner.rejected, "search": winner.to_json().get("search", {}),
                           "timings": winner.timings})

    def _predict(self, job: Job, key: CacheKey) -> Winner:
        config, ms, n = self.predicted(job)
        # Recorded (locally, marked predicted) so the key an engine shows can be explained; the
        # cache never serves it as a hit nor lets it replace a measured winner (Record.predicted).
        self._record(key, {"how": "predicted", "config": config, "ms": ms, "candidates": n})
        return Winner(config, "predicted", ms, key.digest, n)

    def _record(self, key: CacheKey, value: dict) -> None:
        if self.cache is None:
            return
        if self.writer is not None:     # off the GPU's path: its next job does not wait on SQLite
            self.writer.put(key, value)
            return
        try:
            self.cache.store(key, value)
        except (XGError, CacheError, OSError):
            pass      # a cache that cannot be written slows the next build, never this one

    def explain_miss(self, key: CacheKey) -> list[str]:
        """Why `key` missed: the key in full, its parts, and how the nearest stored key differs."""
        local = getattr(self.cache, "local", None)
        if local is None:
            return [f"key {key.digest} (no XG cache to look in)"]
        with self._neighbours_lock:
            if self._neighbours is None:
                self._neighbours = Neighbours.of(local)     # loaded once: a strict build may miss many
        try:
            stored = local.get_record(key.digest)
        except CacheError:
            stored = None
        return miss_report(key, self._neighbours, stored)

    def ranked(self, job: Job) -> list[Candidate]:
        """The job's candidates, best-predicted first, with their predictions."""
        def make() -> list[Candidate]:
            ranked = rank(job.problem, self.candidates(job), self.profile) or \
                rank(job.problem, [default_config(job.problem)], self.profile)
            return [Candidate(config_key(c), c, ms) for ms, c in ranked]
        return self._once("ranked", job, make)

    def seed(self, job: Job, ranked: list[Candidate]) -> str | None:
        """A neighbouring shape's winner of the same kernel (this build's, or the local cache's
        nearest measured record), when it is one of this job's candidates: measured first."""
        keys = {c.key for c in ranked}
        with self._neighbours_lock:
            mine = self.seeds.get(job.spec.name)
        if mine in keys:
            return mine
        local = getattr(self.cache, "local", None)
        if local is None:
            return None
        with self._neighbours_lock:
            if self._neighbours is None:
                try:
                    self._neighbours = Neighbours.of(local)
                except (CacheError, OSError):
                    self._neighbours = Neighbours([])
        near = self._neighbours.nearest(self.key(job))
        try:
            found = config_key({str(k): int(x) for k, x in dict(near.record.value["config"]).items()}) if near else None
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return found if found in keys else None

    def _submit(self, job: Job, c: Candidate, priority: float) -> tuple:
        """(variant, emitted, compile future) of a candidate, or (variant, None, the emit error)."""
        variant = job.fast_variant(c.config)
        try:
            em = emit(job.spec, c.config, variant)
        except Exception as exc:  # noqa: BLE001 (a template that cannot be emitted scores inf)
            return variant, None, exc
        return variant, em, self.compiler.submit(em, c.config["num_warps"], c.config["num_stages"], priority=priority)

    def prefetch(self, job: Job, priority: float) -> None:
        """Start compiling the candidates `job` will measure first (`first_wave`), at `priority`,
        so that they are ready when a GPU gets to the job. Kept until `measure` takes them."""
        if self.compiler is None:
            return
        ranked = self.ranked(job)
        seed = self.wave_seed(job)
        wave = first_wave(ranked, seed, LOOKAHEAD)
        self._prefetched[job.ident] = {c.key: self._submit(job, c, priority) for c in wave}

    def wave_seed(self, job: Job) -> str | None:
        """The seed `job`'s first wave is (or would be) compiled for, fixed at its first call: a
        measuring process that gets the wave starts its search from the same one."""
        return self._once("wave seed", job, lambda: (self.seed(job, self.ranked(job)),))[0]

    def preset(self, job: Job, candidates: list[dict], ranked: list[Candidate], seed: str | None,
               wave: dict[str, tuple], fetch: Callable[[str], Any] | None = None) -> None:
        """Take what another tuner (the build's, for a measuring process) worked out for `job`: its
        candidates, their ranking, the seed and the first wave compiled for it, `wave[config key]`
        = (variant, emitted, binary) or (variant, None or emitted, why it failed) or (variant,
        emitted, None): still compiling there when the job was handed over; `measure` then asks
        `fetch(config key)` for it when it reaches it (binary, or raises why it failed, or None:
        compile it here); without `fetch` such entries are compiled here. Pruning, ranking,
        emitting and looking the wave up in the cache cost tens of milliseconds a job."""
        self._memo[("candidates", job.ident)] = candidates
        self._memo[("ranked", job.ident)] = ranked
        self._memo[("seed", job.ident)] = (seed,)
        configs = {c.key: c.config for c in ranked}
        started = {}
        for k, (variant, em, got) in wave.items():
            if em is None:
                got = RuntimeError(got)
            elif got is None:
                if fetch is None or k not in configs:
                    continue
                got = _Fetched(partial(fetch, k), partial(self.compiler.submit, em, configs[k]["num_warps"],
                                                          configs[k]["num_stages"]))
            else:
                done: futures.Future = futures.Future()
                if isinstance(got, str):
                    done.set_exception(RuntimeError(got))
                else:
                    done.set_result((got, ""))
                got = done
            started[k] = (variant, em, got)
        self._prefetched[job.ident] = started

    def measure(self, job: Job, key: CacheKey, priority: float = 0) -> Winner:
        assert self.measurer is not None and self.compiler is not None
        t_start = time.monotonic()
        ranked = self.ranked(job)
        handed = self._memo.pop(("seed", job.ident), None)     # (the seed its first wave was compiled for)
        search = Search(ranked, seed=handed[0] if handed else self.seed(job, ranked), exhaustive=exhaustive(),
                        margin=template(job.problem.kind).bound_margin)
        started = self._prefetched.pop(job.ident, {})
        if not started:                 # nothing compiled ahead: start before the reference is made
            started = {c.key: self._submit(job, c, priority) for c in search.upcoming(LOOKAHEAD)}
        t_ref = time.monotonic()
        data = JobData(job, device=getattr(self.measurer, "device", "cpu"))
        ref = data.reference(getattr(self.measurer, "device", "cpu"))
        out_dtypes = gate_dtypes(job.spec)
        t_ref = time.monotonic() - t_ref
        races = getattr(self.measurer, "races", False)
        spent = 0.0               # seconds of measuring: the budget does not count waiting for compiles
        waited = 0.0              # seconds waiting for compiles
        rejected: dict[str, str] = {}
        events = self.events
        lookahead = len(ranked) if search.exhaustive else LOOKAHEAD
        while (c := search.next()) is not None:
            for ahead in search.upcoming(lookahead):
                if ahead.key not in started:
                    started[ahead.key] = self._submit(job, ahead, priority)
            if self.budget_s is not None and search.best is not None and spent > self.budget_s:
                search.skip(c.key, "time budget spent")
                continue
            variant, em, fut = started[c.key]
            if em is None:
                rejected[c.key] = f"emit failed: {fut}"
                search.record(c.key, math.inf)
                continue
            t0 = time.monotonic()
            try:
                binary, _ptx = fut.result()
            except Exception as exc:  # noqa: BLE001
                rejected[c.key] = f"compile failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
                search.record(c.key, math.inf)
                continue
            finally:
                waited += time.monotonic() - t0
            t0 = time.monotonic()
            try:
                if races:
                    ms, outs = self.measurer.measure(job, variant, c.config, em, binary, data,
                                                     stop_above=search.stop_above())
                else:
                    ms, outs = self.measurer.measure(job, variant, c.config, em, binary, data)
            except Exception as exc:  # noqa: BLE001 (a launch failure scores inf)
                rejected[c.key] = f"run failed: {str(exc)[:200]}"
                search.record(c.key, math.inf)
                continue
            finally:
                spent += time.monotonic() - t0
            why = self._disagrees(outs, ref, out_dtypes, data)
            if why is None and c.config.get("TF32X3"):
                why = self._as_accurate_as_float32(outs, ref, data)
            if len(outs) != len(ref):
                why = f"{len(outs)} outputs, expected {len(ref)}"
            if why:
                rejected[c.key] = f"wrong result: {why}"
                search.record(c.key, math.inf)
                continue
            if not math.isfinite(ms):
                rejected[c.key] = "no time"
            search.record(c.key, ms)
            if events is not None:
                best = search.best
                events("candidate", job=job.ident, config=c.key, ms=ms, best_ms=best[0] if best else None,
                       left=len(search.upcoming(len(ranked))))
        for c in ranked:                # queued compiles nobody will measure: out of the pool's way
            if c.key in started and c.key not in search.times and started[c.key][1] is not None:
                self.compiler.release(started[c.key][1], c.config["num_warps"], c.config["num_stages"])
        best = search.best
        for k, why in search.pruned.items():
            rejected.setdefault(k, why)
        if best is None:
            reasons = "; ".join(f"{k}: {v}" for k, v in list(rejected.items())[:5])
            raise TuneError(f"job {job.ident}: every candidate failed ({reasons})")
        config = next(c.config for c in ranked if c.key == best[1])
        with self._neighbours_lock:
            self.seeds.setdefault(job.spec.name, best[1])
        measured = sum(1 for k, ms in search.times.items() if k not in search.pruned and k not in rejected)
        stats = {"candidates": len(ranked), "compiled": sum(1 for c in ranked if c.key in started
                                                             and started[c.key][1] is not None),
                 "measured": measured,
                 "pruned": sum(1 for why in search.pruned.values() if why.startswith("bound")),
                 "failed": sum(1 for k in rejected if k not in search.pruned),
                 "seeded": search.seed is not None and search.order[0].key == search.seed,
                 "seconds": round(time.monotonic() - t_start, 3), "measuring_s": round(spent, 3),
                 "waiting_s": round(waited, 3), "reference_s": round(t_ref, 3)}
        if isinstance(getattr(self.measurer, "device_index", None), int):   # which GPU of the host measured it
            from ..settings import visible_device
            stats["gpu"] = visible_device(self.measurer.device_index)
        why = next((w for w in search.pruned.values() if w.startswith("bound")), None)
        if why:
            stats["stopped"] = why          # the first candidate the bound ruled out, with the numbers
        timings = [{"config": c.key, "predicted_ms": c.predicted_ms,
                    "ms": search.times.get(c.key) if math.isfinite(search.times.get(c.key, math.inf)) else None}
                   for c in ranked]
        return Winner(config, "measured", best[0], key.digest, len(ranked), rejected, self.measurer.gpu_name,
                      search=stats, timings=timings)

