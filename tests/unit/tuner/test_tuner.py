"""The tuner on a CPU host: a fake measurer stands in for the GPU (timings and outputs chosen by the
test), Triton really compiles the candidates. Wrong or failing candidates never win; `predict` is
deterministic; `strict` fails naming the jobs; `measure` refuses without a GPU of the target model;
measured winners land in the cache and a second build takes them from there."""

from __future__ import annotations

import concurrent.futures as futures
from pathlib import Path

import pytest
import torch

from xgbuild.cache import Cache
from xgbuild.compiler.driver import compile_source
from xgbuild.errors import CompileError
from xgbuild.hw import load_profile
from xgbuild.runtime.cuda import cubin_arch
from xgbuild.settings import Settings
from xgbuild.tuner.jobs import plan, tuning_env
from xgbuild.tuner.link import build_kernels
from xgbuild.tuner.policy import Policy
from xgbuild.compiler.codegen.templates.base import config_key
from xgbuild.tuner.space import default_config
from xgbuild.tuner.tuner import Compiler, JobData, Tuner, TuneError

SRC = """extern Tensor[float32, T, D] X
extern Tensor[float32, D] G
def main() {
    return X * rsqrt(mean(X * X, dim=1, keepdim=true) + 1e-6) * G
}
"""
DIMS = {"T": 64, "D": 256}


@pytest.fixture(scope="module")
def graph():
    return compile_source(SRC).optimized.main


@pytest.fixture(scope="module")
def job(graph):
    jobs, launches = plan(graph, tuning_env(graph, DIMS))
    assert len(jobs) == 1 and len(launches) == 1
    return jobs[0]


class FakeMeasurer:
    """Times from a table (by config); some configs return wrong numbers, some raise."""
    gpu_name = "NVIDIA H100 80GB HBM3 (fake)"
    device = "cpu"

    def __init__(self, times: dict[str, float], wrong: set[str] = frozenset(), crash: set[str] = frozenset()):
        self.times, self.wrong, self.crash = times, wrong, crash
        self.seen: list[str] = []

    def measure(self, job, variant, config, emitted, binary, data):
        key = config_key(config)
        self.seen.append(key)
        assert cubin_arch(binary.cubin) == 90
        if key in self.crash:
            raise RuntimeError("an illegal memory access was encountered")
        outs = data.reference()
        if key in self.wrong:
            outs = [o.float() * 1.01 + 0.5 for o in outs]       # close, but not within tolerance
        else:
            outs = [o.float() for o in outs]
        return self.times.get(key, 10.0), outs


class FailingCompiler(Compiler):
    def __init__(self, fail: set[str], arch: int = 90) -> None:
        super().__init__(arch)
        self.fail = fail

    def submit(self, em, num_warps, num_stages, priority=0):
        if any(f in em.source for f in self.fail):
            f: futures.Future = futures.Future()
            f.set_exception(RuntimeError("out of resource: shared memory"))
            return f
        return super().submit(em, num_warps, num_stages, priority)


def _configs(tuner, job):
    return tuner.candidates(job)


def test_fastest_correct_candidate_wins_and_wrong_ones_never_do(job) -> None:
    profile = load_profile("H100")
    probe = Tuner(profile)
    cands = _configs(probe, job)[:4]
    assert len(cands) >= 3
    keys = [config_key(c) for c in cands]
    # The fastest is wrong, the second crashes, the third is right.
    times = {keys[0]: 0.001, keys[1]: 0.002, keys[2]: 0.003}
    fake = FakeMeasurer(times, wrong={keys[0]}, crash={keys[1]})
    compiler = Compiler(90)
    tuner = Tuner(profile, policy="measure", measurer=fake, compiler=compiler)
    tuner.candidates = lambda j: cands          # a small space: the test compiles each for real
    w = tuner.tune(job)
    compiler.close()
    assert w.source == "measured" and config_key(w.config) == keys[2]
    assert "wrong result" in w.rejected[keys[0]] and "run failed" in w.rejected[keys[1]]
    assert w.measured_on == fake.gpu_name


def test_candidate_that_fails_to_compile_scores_inf(job) -> None:
    profile = load_profile("H100")
    cands = _configs(Tuner(profile), job)[:2]
    keys = [config_key(c) for c in cands]
    fake = FakeMeasurer({keys[0]: 0.001, keys[1]: 0.5})
    compiler = FailingCompiler({"BLOCK_N"})          # every candidate fails to compile
    tuner = Tuner(profile, policy="measure", measurer=fake, compiler=compiler)
    tuner.candidates = lambda j: cands
    with pytest.raises(TuneError, match="every candidate failed.*compile failed"):
        tuner.tune(job)
    assert fake.seen == []


def test_predicted_mode_is_deterministic(graph) -> None:
    profile = load_profile("H100")
    a = build_kernels(graph, profile, policy="predict", dims=DIMS, workers=1)
    b = build_kernels(graph, profile, policy="predict", dims=DIMS, workers=1)
    assert a.kernels == b.kernels and a.launches == b.launches and a.files == b.files
    assert all(k["tuning"]["source"] == "predicted" for k in a.kernels)


def test_strict_fails_cleanly_naming_the_jobs(graph, tmp_path: Path) -> None:
    cache = Cache.open(Settings(cache_dir=tmp_path / "c"))
    with pytest.raises(TuneError, match=r"--tune=strict: 1 of 1 jobs have no cached winner for H100:\n  xg_rowwise_"):
        build_kernels(graph, load_profile("H100"), policy="strict", dims=DIMS, cache=cache)
    cache.close()


def test_measure_without_a_gpu_of_the_target_model_refuses(graph) -> None:
    with pytest.raises(TuneError, match="needs a local H100 GPU to measure on"):
        build_kernels(graph, load_profile("H100"), policy="measure", dims=DIMS)


def _measuring_tuner(profile, job, cache):
    """A measuring tuner over the job's first two candidates, the second faster (a fake measurer),
    compiling for real through `cache`: (tuner, measurer, candidates, their keys)."""
    cands = _configs(Tuner(profile), job)[:2]
    keys = [config_key(c) for c in cands]
    fake = FakeMeasurer({keys[0]: 0.9, keys[1]: 0.1})
    tuner = Tuner(profile, policy="measure", measurer=fake, compiler=Compiler(90, cache), cache=cache)
    tuner.candidates = lambda j: cands
    return tuner, fake, cands, keys


def test_measured_winner_is_cached_then_reused(job, tmp_path: Path) -> None:
    profile = load_profile("H100")
    cache = Cache.open(Settings(cache_dir=tmp_path / "c"))
    tuner, fake, cands, keys = _measuring_tuner(profile, job, cache)
    compiler = tuner.compiler
    first = tuner.tune(job)
    assert first.source == "measured" and config_key(first.config) == keys[1]
    again = Tuner(profile, policy="strict", cache=cache)
    again.candidates = lambda j: cands
    second = again.tune(job)
    assert second.source == "cache" and second.config == first.config and second.measured_on == fake.gpu_name
    # Another GPU profile is another key: nothing measured on an H100 is claimed for an H200.
    other = Tuner(load_profile("H200"), policy="strict", cache=cache)
    other.candidates = lambda j: cands
    with pytest.raises(TuneError, match="no cached winner"):
        other.tune(job)
    compiler.close()
    cache.close()


def test_reference_is_float64_and_matches_torch(job) -> None:
    data = JobData(job, seed=3)
    (ref,) = data.reference()
    x = data.value_fn("cpu")(job.sites[0][0].operands[0]).double()
    g = data.value_fn("cpu")(job.sites[0][0].operands[1]).double()
    want = x * torch.rsqrt((x * x).mean(dim=1, keepdim=True) + 1e-6) * g
    assert ref.dtype == torch.float64 and torch.allclose(ref, want, rtol=1e-12)


@pytest.mark.parametrize("target,arch", [("H100", 90), ("GB200", 100), ("A100", 80), ("L40S", 89)])
def test_cubins_are_built_for_the_target_arch(graph, target: str, arch: int) -> None:
    table = build_kernels(graph, load_profile(target), policy="predict", dims=DIMS)
    cubins = [data for path, data in table.files.items() if path.endswith(".cubin")]
    assert cubins and all(cubin_arch(c) == arch for c in cubins)
    assert all(v["arch"] == arch for k in table.kernels for v in k["variants"])


def test_unsupported_program_is_a_compile_error() -> None:
    # The checker refuses `@` on bools (XG0109); a graph built directly still reaches the tuner.
    from xgbuild.compiler.ir.graph import GraphBuilder, Op, attrs_of
    b = GraphBuilder("main")
    x = b.add(Op.INPUT, (), "bool", (4, 6), attrs_of(name="X"))
    y = b.add(Op.INPUT, (), "bool", (6, 3), attrs_of(name="Y"))
    b.inputs += [("X", x), ("Y", y)]
    g = b.build({"t": b.add(Op.MATMUL, (x, y), "bool", (4, 3))})
    with pytest.raises(CompileError, match="no GPU code.*no GPU matmul for bool"):
        build_kernels(g, load_profile("H100"), policy="predict")


def test_time_budget_counts_measuring_and_keeps_the_best_so_far(job) -> None:
    profile = load_profile("H100")
    cands = _configs(Tuner(profile), job)[:3]
    keys = [config_key(c) for c in cands]

    class Slow(FakeMeasurer):
        def measure(self, *args):
            import time
            time.sleep(0.05)
            return super().measure(*args)

    fake = Slow({keys[0]: 0.3, keys[1]: 0.1, keys[2]: 0.2})
    compiler = Compiler(90)
    tuner = Tuner(profile, policy="measure", measurer=fake, compiler=compiler, budget_s=0.01)
    tuner.candidates = lambda j: cands
    w = tuner.tune(job)
    compiler.close()
    # Candidates are tried in predicted order; after the first measurement the budget is spent.
    assert len(fake.seen) == 1 and w.source == "measured"
    assert all(w.rejected[k] == "time budget spent" for k in fake.times if k not in fake.seen)


# --- reduced-precision products must be as accurate as float32's own -----------------------------

GEMM32 = "extern Tensor[float32, M, K] A\nextern Tensor[float32, K, N] B\ndef main() {\n    return A @ B\n}\n"


class PrecisionMeasurer:
    """3xTF32 candidates are the fastest; their outputs are float64's plus `scale` times float32
    eager's own error (so scale > 1 is less accurate than float32, however far within 1e-4)."""
    gpu_name = "NVIDIA H100 80GB HBM3 (fake)"
    device = "cpu"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def measure(self, job, variant, config, emitted, binary, data):
        ref, ref32 = data.reference(), data.reference(float64=False)
        if config["TF32X3"]:
            return 1.0, [(r + self.scale * (r32.double() - r)).float() for r, r32 in zip(ref, ref32)]
        return 2.0 + config["BLOCK_M"] / 1000, [r32.float() for r32 in ref32]


class FewCandidates(Tuner):
    def candidates(self, job):
        small = [c for c in super().candidates(job) if c["BLOCK_M"] == 64 and c["BLOCK_N"] == 64]
        return [c for c in small if c["TF32X3"]][:2] + [c for c in small if not c["TF32X3"]][:2]


@pytest.mark.parametrize("scale,x3_wins", [(0.5, True), (1.5, False)])
def test_tf32x3_wins_only_when_as_accurate_as_float32(scale: float, x3_wins: bool) -> None:
    g = compile_source(GEMM32).optimized.main
    jobs, _ = plan(g, {"M": 64, "K": 512, "N": 64})
    tuner = FewCandidates(load_profile("H100"), policy="measure", measurer=PrecisionMeasurer(scale),
                          compiler=Compiler(90))
    cands = tuner.candidates(jobs[0])
    assert {c["TF32X3"] for c in cands} == {0, 1}
    w = tuner.tune(jobs[0])
    assert bool(w.config["TF32X3"]) == x3_wins
    if not x3_wins:
        assert all("float32's own" in why for k, why in w.rejected.items() if '"TF32X3":1' in k)
    # The model alone never picks reduced-precision products.
    assert not Tuner(load_profile("H100"), policy="predict").tune(jobs[0]).config["TF32X3"]


# -- issue 25: a miss ends in an answer ------------------------------------------------------------

def test_a_predicted_winner_is_recorded_marked_predicted_and_never_becomes_a_cache_hit(job, tmp_path: Path) -> None:
    profile = load_profile("H100")
    cache = Cache.open(Settings(cache_dir=tmp_path / "c"))
    first = Tuner(profile, policy="cache", cache=cache).tune(job)
    assert first.source == "predicted"
    record = cache.get_record(first.key)                    # the key an engine shows now explains
    assert record is not None and record.predicted and dict(record.value["config"]) == first.config
    # --tune=cache semantics unchanged: a prediction in the cache is predicted again, not a "cache" hit.
    assert Tuner(profile, policy="cache", cache=cache).tune(job).source == "predicted"
    with pytest.raises(TuneError, match="a predicted winner only"):
        Tuner(profile, policy="strict", cache=cache).tune(job)
    cache.close()


def test_measuring_replaces_a_recorded_prediction(job, tmp_path: Path) -> None:
    profile = load_profile("H100")
    cache = Cache.open(Settings(cache_dir=tmp_path / "c"))
    Tuner(profile, policy="predict", cache=cache).tune(job)
    tuner, fake, cands, keys = _measuring_tuner(profile, job, cache)
    compiler = tuner.compiler
    measured = tuner.tune(job)           # a prediction in the cache is not a tuned hit: it measures
    assert measured.source == "measured" and fake.seen
    record = cache.get_record(measured.key)
    assert not record.predicted and record.value["how"] == "measured"
    strict = Tuner(profile, policy="strict", cache=cache)
    strict.candidates = lambda j: cands
    assert strict.tune(job).source == "cache"
    compiler.close()
    cache.close()


def test_a_strict_miss_prints_the_full_key_its_parts_and_the_nearest_stored_keys_differences(graph, job,
                                                                                             tmp_path: Path) -> None:
    profile = load_profile("H100")
    cache = Cache.open(Settings(cache_dir=tmp_path / "c"))
    tuner = Tuner(profile)
    want = tuner.key(job)
    # A winner measured with another Triton: the usual reason a copied cache misses.
    from dataclasses import replace
    stale = replace(want, toolchain={**dict(want.toolchain), "triton": "0.0-other"})
    cache.store(stale, {"how": "measured", "config": default_config(job.problem), "ms": 0.1,
                        "measured_on": "NVIDIA H100 80GB HBM3", "candidates": 2})
    with pytest.raises(TuneError) as err:
        build_kernels(graph, profile, policy="strict", dims=DIMS, cache=cache)
    text = str(err.value)
    assert f"key {want.digest} (tuned-kernel rowwise" in text
    for part in ("kernel_ir", "shapes", "dtypes", "gpu_profile", "search_space", "policy", "toolchain", "kind"):
        assert f"\n        {part}: " in text, part
    assert f"nearest stored key {stale.digest} differs in: toolchain" in text
    assert '        toolchain.triton:\n          - "' in text and '          + "0.0-other"' in text
    cache.close()


def test_a_cache_that_cannot_store_a_cubin_slows_the_next_build_not_this_one(job) -> None:
    """A full disk under the cache (sqlite's "database or disk is full" is a CacheError, not an
    XGError) must not fail the compile that produced the cubin (issue 25)."""
    from xgbuild.cache.errors import CacheError
    from xgbuild.compiler.codegen.templates import emit
    from xgbuild.tuner.space import default_config

    class FullDisk:
        def lookup(self, key):
            return None

        def store(self, *args, **kwargs):
            raise CacheError("database or disk is full")
    compiler = Compiler(90, cache=FullDisk())
    cfg = default_config(job.problem)
    em = emit(job.spec, cfg, job.fast_variant(cfg))
    kb, _ptx = compiler.submit(em, cfg["num_warps"], cfg["num_stages"]).result(timeout=120)
    compiler.close()
    assert kb.cubin and compiler.compiled == 1


def test_a_float32_output_of_a_bf16_product_is_held_to_bf16s_tolerance() -> None:
    """The correctness gate compares with a float64 reference that rounds nowhere: a kernel that
    rounds its product to bf16 and casts it to a float32 output (Llama's residual before RMSNorm)
    carries bf16's error, so every candidate of that job failed float32's 1e-4 on an H200."""
    from xgbuild.tuner.tuner import gate_dtypes
    mixed = compile_source("""extern Tensor[bfloat16, M, K] A
extern Tensor[bfloat16, K, N] B
def main() {
    return cast(A @ B, float32)
}
""").optimized.main
    (job,), _ = plan(mixed, {"M": 32, "K": 64, "N": 48})
    assert [n.dtype for n in job.spec.nodes][-1] == "float32" and gate_dtypes(job.spec) == ["bfloat16"]
    exact = compile_source("""extern Tensor[float32, M, K] A
extern Tensor[float32, K, N] B
def main() {
    return A @ B
}
""").optimized.main
    (job,), _ = plan(exact, {"M": 32, "K": 64, "N": 48})
    assert gate_dtypes(job.spec) == ["float32"]


def test_compiler_shares_one_compile_per_kernel_and_cancels_released_ones(job) -> None:
    """Two requests for the same kernel share a compile; a queued compile nobody wants is cancelled."""
    from xgbuild.compiler.codegen.templates import emit
    profile = load_profile("H100")
    cands = Tuner(profile).candidates(job)[:3]
    ems = [emit(job.spec, c, job.fast_variant(c)) for c in cands]
    import threading
    compiler = Compiler(90)                                  # one worker: later submissions queue
    gate = threading.Event()
    compiler._executor().submit(gate.wait, 120)              # holds the worker until the queue is set up
    try:
        a = compiler.submit(ems[0], cands[0]["num_warps"], cands[0]["num_stages"])
        b = compiler.submit(ems[1], cands[1]["num_warps"], cands[1]["num_stages"], priority=1)
        again = compiler.submit(ems[0], cands[0]["num_warps"], cands[0]["num_stages"])
        assert again is a and compiler.shared == 1
        compiler.release(ems[1], cands[1]["num_warps"], cands[1]["num_stages"])
        assert b.cancelled()
        gate.set()
        kb, _ptx = a.result(timeout=300)
        assert cubin_arch(kb.cubin) == 90 and compiler.compiled == 1
        b2 = compiler.submit(ems[1], cands[1]["num_warps"], cands[1]["num_stages"])   # wanted again: compiled
        assert b2 is not b and cubin_arch(b2.result(timeout=300)[0].cubin) == 90
        # held twice, released once: still wanted
        c1 = compiler.submit(ems[2], cands[2]["num_warps"], cands[2]["num_stages"])
        compiler.submit(ems[2], cands[2]["num_warps"], cands[2]["num_stages"])
        compiler.release(ems[2], cands[2]["num_warps"], cands[2]["num_stages"])
        assert not c1.cancelled() and c1.result(timeout=300)
    finally:
        gate.set()
        compiler.close()


def test_measured_search_stops_early_and_reports_it(job) -> None:
    """With times that follow the model, the search stops at the bound: fewer compiled and
    measured than the space holds, the rest pruned with a reason, and the manifest entry says so."""
    profile = load_profile("H100")
    probe = Tuner(profile)
    from xgbuild.tuner.search import Candidate
    # the model's predictions spread out (0.01, 0.02, ... ms) and the measurements follow them
    ranked = [Candidate(c.key, c.config, 0.01 * (i + 1)) for i, c in enumerate(probe.ranked(job)[:8])]
    n = len(ranked)
    assert n >= 5
    times = {c.key: c.predicted_ms * 1.1 for c in ranked}
    fake = FakeMeasurer(times)
    compiler = Compiler(90)
    tuner = Tuner(profile, policy="measure", measurer=fake, compiler=compiler)
    tuner.candidates = lambda j: [c.config for c in ranked]
    tuner.ranked = lambda j: ranked
    import xgbuild.compiler.codegen.templates.rowwise as rowwise
    old = rowwise.RowwiseTemplate.bound_margin
    rowwise.RowwiseTemplate.bound_margin = 0.85           # this job is a rowwise one: let its bound act
    try:
        w = tuner.tune(job)
    finally:
        rowwise.RowwiseTemplate.bound_margin = old
        compiler.close()
    assert config_key(w.config) == ranked[0].key
    s = w.to_json()["search"]
    assert s["candidates"] == n and s["measured"] == len(fake.seen) < n and s["pruned"] == n - s["measured"]
    assert all(w.rejected[c.key].startswith("bound:") for c in ranked if c.key not in fake.seen)
    assert [r["config"] for r in w.timings] == [c.key for c in ranked]


def test_kernels_that_compile_to_the_same_bytes_are_stored_once(tmp_path) -> None:
    """An engine of many matmuls of one kernel at different sizes stores its cubin and PTX once
    (files are named by content), so it stays small and reads back (192 copies once tripped the
    decompression-bomb cap at 110x)."""
    from xgbuild.build.package import engine_of
    from xgbuild.packager.engine_file import read_engine
    from xgbuild.runtime.engine import Engine
    from xgbuild.tuner.link import build_kernels
    widths = [64 + 16 * i for i in range(13)]
    src = "\n".join(["extern Tensor[bfloat16, T, W0] X"] + [f"extern Tensor[bfloat16, W{i}, W{i + 1}] M{i + 1}"
                                                         for i in range(12)])
    src += "\ndef main() {\n    return X" + "".join(f" @ M{i + 1}" for i in range(12)) + "\n}\n"
    compiled = compile_source(src)
    profile = load_profile("H100")
    table = build_kernels(compiled.optimized.main, profile, policy="predict",
                          dims={"T": 128, **{f"W{i}": w for i, w in enumerate(widths)}})
    variants = [v for k in table.kernels for v in k["variants"]]
    assert len(table.kernels) == 12 and len(variants) == 24
    cubins = {v["cubin"] for v in variants}
    assert len(cubins) < len(variants) and {p for p in table.files if p.endswith(".cubin")} == cubins
    for v in variants:                       # a path names its bytes
        assert v["cubin_sha256"][:16] in v["cubin"] and v["ptx_sha256"][:16] in v["ptx"]
    path = tmp_path / "chain.xge"
    engine_of(compiled, table, profile).save(path)
    read_engine(path)
    assert len(Engine.load(path).manifest["kernels"]) == 12


def _two_softmax_jobs() -> list:
    """Two measured jobs (two softmax kernels), for the several-GPU tests."""
    src = """extern Tensor[float32, T, D] X
extern Tensor[float32, T, D] Y
def main() {
    return softmax(X, dim=1) + softmax(Y * 2.0, dim=1)
}
"""
    g = compile_source(src).optimized.main
    return plan(g, tuning_env(g, {"T": 64, "D": 128}))[0]


def test_a_gpu_whose_process_fails_hands_its_job_back(monkeypatch, capsys) -> None:
    """Several GPUs: one whose measuring process cannot start gives its job back with a warning,
    and the GPU measuring in the build's process tunes every job."""
    import time
    from xgbuild.tuner import link
    from xgbuild.tuner.gpu_procs import GpuUnavailable
    jobs = _two_softmax_jobs()
    assert len(jobs) >= 2

    class Slow(FakeMeasurer):
        def measure(self, *args):
            time.sleep(0.05)                   # the failing GPU takes a job before this one is done
            return super().measure(*args)

    class Broken:
        taken: list = []

        def tune(self, job, priority=0, looked_up=True):
            Broken.taken.append(job.ident)
            raise GpuUnavailable("GPU 1's measuring process did not start: RuntimeError: no device")

        def close(self):
            pass

    monkeypatch.setattr(link, "gpu_processes", lambda *a: [Broken()])
    compiler = Compiler(90)
    try:
        winners = link.tune_jobs(jobs, load_profile("H100"), policy="measure",
                                 measurers=[Slow({}), Slow({})], compiler=compiler)
    finally:
        compiler.close()
    assert set(winners) == {j.ident for j in jobs} and all(w.source == "measured" for w in winners.values())
    assert len(Broken.taken) == 1
    assert "warning: GPU 1's measuring process did not start" in capsys.readouterr().err


def test_a_cached_search_summary_reaches_the_manifest_only_as_known_fields() -> None:
    """A record's `search` (perhaps from an untrusted remote) is cut to the known counts, a bool
    and one short line before the engine's manifest carries it."""
    from xgbuild.tuner.tuner import _search_summary
    forged = {"candidates": 48, "compiled": "lots", "measured": -1, "pruned": 2**40, "failed": 0,
              "seeded": "yes", "stopped": "bound: ...\nrm -rf /" + "x" * 10_000, "payload": "x" * 10**6}
    assert _search_summary(forged) == {"candidates": 48, "failed": 0, "stopped": "bound: ..."}
    assert _search_summary(["not", "a", "dict"]) == {} and _search_summary(None) == {}
    honest = {"candidates": 48, "compiled": 20, "measured": 18, "pruned": 28, "failed": 2, "seeded": True,
              "stopped": "bound: predicted 1.2 ms x 0.9 is not below the best measured 1.0 ms"}
    assert _search_summary(honest) == honest


def test_the_callers_measuring_processes_are_used_and_left_open(monkeypatch) -> None:
    """`context.tuning` starts GPUs 1..'s processes before planning (their start-up is seconds of
    torch and CUDA): `tune_jobs` uses those, starts none of its own, and leaves closing to the
    caller, which may tune again with them."""
    import time
    from xgbuild.tuner import link
    from xgbuild.tuner.tuner import Winner
    jobs = _two_softmax_jobs()

    class Slow(FakeMeasurer):
        def measure(self, *args):
            time.sleep(0.05)
            return super().measure(*args)

    class Proc:
        def __init__(self):
            self.taken, self.closed = [], False

        def tune(self, job, priority=0, looked_up=True):
            self.taken.append(job.ident)
            return Winner({"BLOCK_N": 128, "num_warps": 4, "num_stages": 1}, "measured", 1.0, "k")

        def close(self):
            self.closed = True

    proc = Proc()
    monkeypatch.setattr(link, "gpu_processes", lambda *a: pytest.fail("started processes of its own"))
    compiler = Compiler(90)
    try:
        winners = link.tune_jobs(jobs, load_profile("H100"), policy="measure", measurers=[Slow({}), Slow({})],
                                 compiler=compiler, gpu_procs=[proc])
    finally:
        compiler.close()
    assert set(winners) == {j.ident for j in jobs}
    assert proc.taken and not proc.closed


def test_a_measuring_process_gets_a_job_once_its_first_wave_is_compiled() -> None:
    """The build's process compiled the job's first wave ahead: the other GPU's process gets the
    job when those compiles are done (it then finds them in the shared cache, instead of
    compiling them again in a pool of its own that is still starting)."""
    import threading
    import time
    from concurrent import futures as cf
    from types import SimpleNamespace
    from xgbuild.tuner.dispatch import _await_first_wave
    slow, failed = cf.Future(), cf.Future()
    tuner = SimpleNamespace(_prefetched={"job-a": {"c0": (None, "em", slow), "c1": (None, None, failed)}})
    threading.Timer(0.2, slow.set_result, args=(("cubin", "ptx"),)).start()
    t0 = time.monotonic()
    _await_first_wave(tuner, SimpleNamespace(ident="job-a"))
    assert slow.done() and time.monotonic() - t0 >= 0.15     # waited for the compile, not the emit failure
    assert "job-a" not in tuner._prefetched                   # the wave is the other process's now
    _await_first_wave(tuner, SimpleNamespace(ident="job-b"))  # nothing compiled ahead: no wait


def test_a_winners_json_leaves_out_this_builds_telemetry() -> None:
    """Which GPU measured a job and how long it took differ from build to build: the engine's
    manifest keeps the search's counts and reasons only (a rebuild gives the same bytes)."""
    from xgbuild.tuner.tuner import Winner
    w = Winner({"BLOCK": 1}, "measured", 1.0, "k", search={"measured": 3, "pruned": 2, "gpu": "1", "seconds": 2.5,
                                                         "waiting_s": 1.0, "stopped": "bound: ..."})
    assert w.to_json()["search"] == {"measured": 3, "pruned": 2, "stopped": "bound: ..."}


def test_an_error_in_a_gpu_thread_is_the_builds_error(capsys) -> None:
    """Several GPUs measure from threads: an error after a job is measured (here the progress
    display's) ends the build with that error, not with a thread's traceback on stderr."""
    import time
    from xgbuild.tuner import link
    from xgbuild.tuner.progress import TuneProgress
    jobs = _two_softmax_jobs()

    class Slow(FakeMeasurer):
        def measure(self, *args):
            time.sleep(0.02)
            return super().measure(*args)

    class Broken(TuneProgress):
        def advance(self, *args, **kwargs):
            raise RuntimeError("the display broke")

    compiler = Compiler(90)
    try:
        with pytest.raises(RuntimeError, match="the display broke"):
            link.tune_jobs(jobs, load_profile("H100"), policy="measure", measurers=[Slow({}), Slow({})],
                           compiler=compiler, progress=Broken(len(jobs)))
    finally:
        compiler.close()
    assert "Traceback" not in capsys.readouterr().err


def test_the_tuning_context_starts_the_gpu_processes_first_and_closes_them(monkeypatch, tmp_path) -> None:
    """With several GPUs, `context.tuning` starts GPUs 1..'s measuring processes before the compile
    pool (their torch import is on the critical path), hands them to the build, and closes them
    (a process still starting is killed) when the step ends, even when it fails."""
    from xgbuild.build import context
    from xgbuild.tuner import cuda_measure, link
    log: list[str] = []

    class Proc:
        def close(self):
            log.append("proc closed")

    class FakeCompiler:
        workers = 4

        def start(self):
            log.append("pool started")

        def close(self):
            log.append("pool closed")

    monkeypatch.setattr(cuda_measure, "local_measurers", lambda profile: [FakeMeasurer({}), FakeMeasurer({})])
    monkeypatch.setattr(link, "new_compiler", lambda *a: FakeCompiler())
    monkeypatch.setattr(link, "gpu_processes", lambda *a: log.append("procs started") or [Proc()])
    monkeypatch.setenv("XG_CACHE_DIR", str(tmp_path / "cache"))
    settings = Settings.from_env()
    with context.tuning(load_profile("H100"), Policy.MEASURE, settings) as t:
        assert len(t.gpu_procs) == 1 and log == ["procs started", "pool started"]
    assert log[2:] == ["proc closed", "pool closed"]
    log.clear()
    with pytest.raises(RuntimeError):
        with context.tuning(load_profile("H100"), Policy.MEASURE, settings):
            raise RuntimeError("the build failed")
    assert log == ["procs started", "pool started", "proc closed", "pool closed"]
    log.clear()
    with context.tuning(load_profile("H100"), Policy.CACHE, settings) as t:     # nothing measured: none
        assert not t.gpu_procs
    assert "procs started" not in log


class _Eager:
    """Job data whose program-dtype reference is given (what eager computes in float32)."""

    def __init__(self, eager: list[torch.Tensor]) -> None:
        self.eager = eager

    def reference(self, device="cpu", float64=True):
        assert not float64
        return self.eager


def test_ill_conditioned_outputs_are_judged_against_eager_in_the_same_dtypes() -> None:
    """A float32 output off the float64 reference by more than float32's tolerance passes when eager
    float32 is nearly as far off (the job's random data made the result ill-conditioned: AdamW's
    update over a randn second moment), and fails when eager is much closer or NaNs differ."""
    tuner = Tuner(load_profile("H100"))
    gen = torch.Generator().manual_seed(2)
    ref = torch.randn(1000, generator=gen, dtype=torch.float64)
    noise = torch.randn(1000, generator=gen, dtype=torch.float64)
    off = (ref + 4e-3 * noise * ref.norm() / noise.norm()).float()          # relative error 4e-3
    assert tuner._disagrees([off], [ref], ["float32"], _Eager([(ref + 3e-3 * noise).float()])) is None
    why = tuner._disagrees([off], [ref], ["float32"], _Eager([ref.float()]))
    assert why is not None and why.startswith("relative error") and "eager" in why
    nan = off.clone()
    nan[3] = float("nan")
    assert "NaN" in tuner._disagrees([nan], [ref], ["float32"], _Eager([off]))
    # Exact outputs are judged exactly, as before.
    assert tuner._disagrees([torch.arange(5)], [torch.arange(5) + 1], ["int64"], _Eager([])) is not None


def test_elements_eager_gets_wrong_are_set_aside() -> None:
    """AdamW over a randn second moment: where float32's `0.95 v + 0.05 g^2` lands below zero and
    float64's does not, a candidate's root is NaN and eager's is not, and eager's update is off by
    thousands there. The candidate passes if it matches the reference wherever eager does (at
    least MIN_CONDITIONED of the elements); a wrong or NaN element among those fails it."""
    tuner = Tuner(load_profile("H100"))
    gen = torch.Generator().manual_seed(4)
    ref = torch.randn(10_000, generator=gen, dtype=torch.float64)
    eager = ref.float().clone()
    bad = torch.arange(0, 10_000, 400)                  # 25 ill-conditioned elements (0.25%)
    eager[bad] = 1e4
    good = ref.float().clone()
    good[bad] = float("nan")
    assert tuner._disagrees([good], [ref], ["float32"], _Eager([eager])) is None
    wrong = good.clone()
    wrong[7] += 1.0                                     # an element eager gets right
    why = tuner._disagrees([wrong], [ref], ["float32"], _Eager([eager]))
    assert why is not None and "eager" in why
    nan = good.clone()
    nan[11] = float("nan")
    assert tuner._disagrees([nan], [ref], ["float32"], _Eager([eager])) is not None
    # Eager wrong on more than 1% of the elements: nothing is set aside.
    worse = eager.clone()
    worse[torch.arange(1, 10_000, 50)] = 1e4
    assert tuner._disagrees([good], [ref], ["float32"], _Eager([worse])) is not None
