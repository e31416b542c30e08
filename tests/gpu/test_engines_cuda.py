"""Engines on a real GPU: every example and model program, built for this GPU's profile, run through
cubins launched by cuda-python and compared with the float64 CPU reference; check mode on the GPU;
a measured tuning build then a warm build from the cache."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from gpu_target import local_target

from xgbuild.build.package import engine_of
from xgbuild.cache import Cache
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.constants import normalize
from xgbuild.errors import EngineError, ExecutionError
from xgbuild.hw import load_profile
from xgbuild.runtime.engine import Engine
from xgbuild.runtime.tensor_io import random_inputs
from xgbuild.settings import Settings
from xgbuild.tuner.cuda_measure import local_measurers
from xgbuild.tuner.link import build_kernels

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((REPO / "examples").glob("*.xg")) + sorted((REPO / "models").glob("*.xg"))
TOL = {"float32": 1e-4, "float64": 1e-9, "bfloat16": 3e-2, "float16": 5e-3}
# GPT-2 small (models/train.xg) at a small configuration: its float64 CPU reference at full size
# would take minutes and tens of GB. Its mixed-precision policy off (COMPUTE=float32): the float64
# reference runs every dtype in float64, so bfloat16 products would only be compared as noise
# against float32's tolerance (tests/models/test_gpt2.py compares them with torch.autocast).
CONSTS = {"train.xg": {"L": 2, "D": 64, "H": 2, "T": 32, "V": 128, "B": 2, "COMPUTE": "float32"}}


def build(compiled, policy: str = "predict", cache=None, dims=None, measurers=None) -> Engine:
    table = build_kernels(compiled.optimized.main, load_profile(local_target()), policy=policy, cache=cache,
                          dims=dims, measurers=measurers)
    return engine_of(compiled, table)


def compare(engine: Engine, dims: dict[str, int], seed: int) -> None:
    sig = {s["name"]: (s["dtype"], tuple(dims.get(d, d) if isinstance(d, str) else d for d in s["shape"]))
           for s in engine.signature}
    if any(s["name"] in ("TOKENS", "STEP") for s in engine.signature):
        import sys
        sys.path.insert(0, str(REPO / "tools"))
        from model_inputs import first_step_inputs      # a model's valid first step (sqrt of moments >= 0)
        inputs = first_step_inputs(engine, seed)
        # A later step's AdamW state, moments away from zero: a first step's update is m / sqrt(v) =
        # sign(g), which flips with rounding where a gradient is zero in exact arithmetic (attention's
        # key bias: softmax ignores a constant added to a row), so it would compare only noise there.
        gen = torch.Generator().manual_seed(seed + 1)
        for name, t in list(inputs.items()):
            if name.startswith("M_"):
                inputs[name] = (0.01 * torch.randn(t.shape, generator=gen, dtype=torch.float64)).to(t.dtype)
            elif name.startswith("V_"):
                inputs[name] = (1e-4 * (1 + torch.rand(t.shape, generator=gen, dtype=torch.float64))).to(t.dtype)
            elif name == "STEP":
                inputs[name] = torch.tensor(10.0, dtype=t.dtype)
    else:
        inputs = random_inputs(sig, seed=seed)
    ref = engine.run(inputs, device="cpu", float64=True)
    dtypes = {k: v.dtype for k, v in engine.run(inputs, device="cpu").tensors.items()}
    got = engine.run({k: v.cuda() for k, v in inputs.items()}, device="cuda")
    assert got.metadata["executor"] == "cuda"
    for name, r in ref.tensors.items():
        g = got.tensors[name].cpu()
        assert g.dtype == dtypes[name], name        # the program's dtype, as the CPU engine gives it
        if g.dtype.is_floating_point:
            err = ((g.double() - r.double()).norm() / r.double().norm().clamp_min(1e-30)).item()
            tol = TOL[str(g.dtype).replace("torch.", "")]
            assert err < tol, f"{name}: relative error {err:.3g} >= {tol}"
        else:
            assert torch.equal(g, r.to(g.dtype)), name


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_program_on_cuda_matches_cpu_reference(path: Path) -> None:
    compiled = compile_file(path, CheckOptions(consts=normalize(CONSTS.get(path.name))))
    engine = build(compiled, dims={"T": 64, "D": 96, "F": 128, "S": 64, "N": 64, "M": 64, "K": 64})
    # At the tuning sizes (the tuned variants) and at odd ones (masks, the generic variants).
    compare(engine, {"T": 64, "D": 96, "F": 128, "S": 64, "N": 64, "M": 64, "K": 64, "B": 4}, seed=1)
    compare(engine, {"T": 37, "D": 50, "F": 29, "S": 23, "N": 45, "M": 31, "K": 19, "B": 3}, seed=2)


def test_saved_engine_runs_on_cuda(tmp_path: Path) -> None:
    compiled = compile_file(REPO / "examples" / "mlp.xg")
    build(compiled).save(tmp_path / "mlp.xge")
    engine = Engine.load(tmp_path / "mlp.xge")
    compare(engine, {"T": 128, "D": 64, "F": 256}, seed=3)


def test_check_mode_on_cuda_names_the_origin() -> None:
    src = "extern Tensor[float32, N] X\ndef main() {\n    y = exp(X * 100.0)\n    return y + 1.0\n}\n"
    engine = build(compile_source(src))
    x = torch.full((64,), 10.0, device="cuda")
    with pytest.raises(ExecutionError, match=r"Inf.*`exp`.*line 3"):
        engine.run({"X": x}, device="cuda", wait=True)
    assert engine.run({"X": x}, device="cuda", check=False).tensors["out"].isinf().all()


def test_check_mode_on_cuda_is_read_without_stopping_the_gpu() -> None:
    # A run returns once queued; its check is read when the result is, at the next run, or at
    # synchronize(): each failure raised once (each time its result is read), good runs unaffected.
    src = "extern Tensor[float32, N] X\ndef main() {\n    y = exp(X * 100.0)\n    return y + 1.0\n}\n"
    engine = build(compile_source(src))
    x = torch.full((64,), 10.0, device="cuda")
    ok = 0.5 * torch.rand(64, device="cuda")                # exp(50) at most: finite in float32
    for stage in range(4):                                  # kernel by kernel, capture, replays
        result = engine.run({"X": x}, device="cuda")        # queued: nothing read yet
        with pytest.raises(ExecutionError, match=r"Inf.*`exp`.*line 3"):
            result.value
        with pytest.raises(ExecutionError, match=r"Inf.*`exp`.*line 3"):
            result.tensors
        engine.run({"X": x}, device="cuda", wait=False)
        torch.cuda.synchronize()
        with pytest.raises(ExecutionError, match=r"run #\d+ of this engine, queued earlier.*`exp`.*line 3"):
            engine.run({"X": ok}, device="cuda", wait=False)
        good = engine.run({"X": ok}, device="cuda")
        assert torch.allclose(good.value, torch.exp(ok * 100.0) + 1.0, rtol=1e-5), stage
        engine.synchronize()                                # nothing left to report
        engine.run({"X": torch.full((64,), 10.0, device="cuda")}, device="cuda", wait=False)
        with pytest.raises(ExecutionError, match=r"stored by .*line \d.*inputs are gone"):
            engine.synchronize()                            # the inputs died: the storing kernel is named
    assert engine.cuda_executor()._captured


def test_check_mode_reuses_its_slots_and_names_the_failed_run() -> None:
    # More queued runs than the mailbox has slots, through the flag word's fast path: run #151
    # alone overflows; its failure is raised once, with its number, and the runs after it are good.
    src = "extern Tensor[float32, N] X\ndef main() {\n    y = exp(X * 100.0)\n    return y + 1.0\n}\n"
    engine = build(compile_source(src))
    ok = 0.5 * torch.rand(64, device="cuda")
    bad = torch.full((64,), 10.0, device="cuda")
    results = []
    with pytest.raises(ExecutionError, match=r"run #151 of this engine, queued earlier.*`exp`.*line 3"):
        for i in range(200):
            results.append(engine.run({"X": bad if i == 150 else ok}, device="cuda", wait=False))
        engine.synchronize()
    engine.synchronize()                                    # reported once: nothing left
    assert 150 < len(results) <= 200
    for r in results[:150]:
        assert torch.allclose(r.value, torch.exp(ok * 100.0) + 1.0, rtol=1e-5)
    assert results[150].value.isinf().all()
    good = engine.run({"X": ok}, device="cuda")
    assert torch.allclose(good.value, torch.exp(ok * 100.0) + 1.0, rtol=1e-5)


def test_engine_for_another_arch_is_refused() -> None:
    compiled = compile_file(REPO / "examples" / "mlp.xg")
    other = "B200" if local_target() != "B200" else "H100"
    engine = engine_of(compiled, build_kernels(compiled.optimized.main, load_profile(other)))
    x = {s["name"]: torch.randn(8, 8).bfloat16().cuda() if len(s["shape"]) == 2 else torch.randn(8).bfloat16().cuda()
         for s in engine.signature}
    with pytest.raises(EngineError, match=r"sm_100.*sm_90|sm_90.*sm_100"):
        engine.run(x, device="cuda")


def test_measured_build_then_warm_build_from_cache(tmp_path: Path, capsys) -> None:
    cache = Cache.open(Settings(cache_dir=tmp_path / "cache"))
    compiled = compile_file(REPO / "examples" / "mlp.xg")
    profile = load_profile(local_target())
    measurers = local_measurers(profile)
    assert measurers, "no local GPU matches the target profile"
    t0 = time.perf_counter()
    cold = build_kernels(compiled.optimized.main, profile, policy="measure", cache=cache,
                         dims={"T": 256, "D": 256, "F": 512}, measurers=measurers, budget_s=30)
    cold_s = time.perf_counter() - t0
    assert cold.stats["measured"] == cold.stats["jobs"] == 2
    for k in cold.kernels:
        assert k["tuning"]["source"] == "measured" and k["tuning"]["measured_on"]
    t0 = time.perf_counter()
    warm = build_kernels(compiled.optimized.main, profile, policy="strict", cache=cache,
                         dims={"T": 256, "D": 256, "F": 512})
    warm_s = time.perf_counter() - t0
    assert warm.stats["cache"] == warm.stats["jobs"] and warm.stats["compiled"] == 0
    assert [k["tuning"]["config"] for k in warm.kernels] == [k["tuning"]["config"] for k in cold.kernels]
    with capsys.disabled():
        print(f"\n[tuning] mlp: measured build {cold_s:.2f} s, warm build {warm_s:.3f} s "
              f"({warm.stats['compile_cache_hits']} cubins and {warm.stats['cache']} winners from the cache)")
    engine = engine_of(compiled, warm)
    compare(engine, {"T": 256, "D": 256, "F": 512}, seed=4)
    cache.close()


def _interpreted_programs() -> dict:
    import importlib.util
    path = REPO / "tests" / "unit" / "codegen" / "test_kernels_interpreted.py"
    spec = importlib.util.spec_from_file_location("xg_interpreted_programs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PROGRAMS


@pytest.mark.parametrize("name", ["unindex", "vector_int_matmul"])
def test_gradients_of_indexing_vector_and_integer_matmuls_on_cuda(name: str) -> None:
    # The same programs the interpreter tests check on the CPU, on the GPU: every IR op has a kernel.
    engine = build(compile_source(_interpreted_programs()[name][1]), dims={"T": 64, "D": 96, "F": 128, "B": 2})
    compare(engine, {"T": 64, "D": 96, "F": 128, "B": 2}, seed=5)
    compare(engine, {"T": 37, "D": 50, "F": 29, "B": 3}, seed=6)


def test_profile_times_each_kernel_with_cuda_events(tmp_path: Path) -> None:
    """`xgrun --profile --trace` on the GPU: a row per kernel named by the engine's kernels and the
    source lines they store, CUDA-event times adding up to at most each iteration, the roofline
    share of a real GEMM between 0 and 1, and a Chrome trace with every launch; the run's result
    is the unprofiled run's."""
    import json
    import subprocess
    import sys
    src = ("extern Tensor[bfloat16, 2048, 2048] A\nextern Tensor[bfloat16, 2048, 2048] B\n"
           "def main() {\n    c = A @ B\n    return relu(c) * 2.0\n}\n")
    compiled = compile_source(src, "prof.xg")
    engine = build(compiled)
    path = tmp_path / "prof.xge"
    engine.save(path)
    trace = tmp_path / "t.json"
    cmd = [sys.executable, "-m", "xgbuild.cli.xgrun", str(path), "--device", "cuda", "--warmup", "2",
           "--iterations", "5", "--profile", "--trace", str(trace), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    prof = summary["profile"]
    names = {k["name"] for k in engine.manifest["kernels"]}
    assert {r["kernel"] for r in prof["rows"]} <= names and prof["rows"]
    gemm = prof["rows"][0]
    assert gemm["where"].startswith("line ") and gemm["flops"] >= 2 * 2048 ** 3
    assert 0 < gemm["roofline"] <= 1.2, gemm     # (the peak is the profile's measured bf16 rate)
    assert 0 <= prof["host_share"] < 1 and prof["kernels_ms"] <= prof["run_ms"]["max"]
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert len(events) == 5 * sum(r["launches"] for r in prof["rows"])
    plain = subprocess.run(cmd[:6] + ["--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert json.loads(plain.stdout)["outputs"] == summary["outputs"]


EMBED_GRAD = """import std.nn
COMPUTE = bfloat16
V = 50257
extern Tensor[int64, T] I
extern Tensor[float32, V, D] E
extern Tensor[float32, T, D] G
def f(Tensor[int64, T] i, Tensor[float32, V, D] e, Tensor[float32, T, D] g) -> float32 {
    return sum(embed(i, e) * g)
}
def main() {
    return grad(f, wrt=(e))(I, E, G)
}
"""


def test_embedding_gradient_is_a_deterministic_scatter_on_cuda() -> None:
    """GPT-2's vocabulary: the table's gradient is a `scatter` kernel (no one-hot, no product),
    matching the float64 sum of the bf16 rows, and two runs give the same bits."""
    compiled = compile_source(EMBED_GRAD)
    dims = {"T": 4096, "V": 50257, "D": 256}
    engine = build(compiled, dims={"T": 4096, "D": 256})
    assert [k["kind"] for k in engine.manifest["kernels"]].count("scatter") == 1
    assert not any(k["kind"] == "matmul" for k in engine.manifest["kernels"])
    gen = torch.Generator().manual_seed(7)
    idx = torch.randint(0, dims["V"], (dims["T"],), generator=gen)
    idx[:64] = 17                                  # one row gathering many tokens
    e = torch.randn(dims["V"], dims["D"], generator=gen)
    g = torch.randn(dims["T"], dims["D"], generator=gen)
    inputs = {"I": idx.cuda(), "E": e.cuda(), "G": g.cuda()}
    first = next(iter(engine.run(inputs, device="cuda", wait=True).tensors.values())).clone()
    second = next(iter(engine.run(inputs, device="cuda", wait=True).tensors.values()))
    assert torch.equal(first, second)
    want = torch.zeros(dims["V"], dims["D"], dtype=torch.float64).index_add_(0, idx, g.bfloat16().double())
    err = ((first.cpu().double() - want).norm() / want.norm()).item()
    assert err < 4e-3, err
