"""The benchmark workloads (docs/codegen.md, "Benchmark") written in XG, beside PyTorch eager and
torch.compile, on one GPU; causal attention also beside `F.scaled_dot_product_attention` on each of
its backends (flash, memory-efficient, cuDNN, math), the best of which is its best peer.

Each workload is compiled by xgc's library path for the local GPU's profile with the tuner
measuring on this GPU (`--tune measure`, winners cached), run through the engine's cubins, checked
against a float64 reference (computed by torch on the GPU from the same inputs, outputs poisoned
before the XG run), then timed with `triton.testing.do_bench` (CUDA events, median) like the peers,
as a user calls it: `xg.run_engine(engine, inputs, device="cuda")` at its defaults (checks on;
the ratio to the best peer is this one's), and for reference with checks off and as the executor's
own launch loop (no API, no checks: the kernels alone).
Prints a table (ms, ratio to the best peer, % of floor) and writes JSON.

    python tools/bench/bench_kernels.py [--only NAME ...] [--json out.json] [--budget 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import xg  # noqa: E402
from xgbuild.build.package import engine_of  # noqa: E402
from xgbuild.cache import Cache  # noqa: E402
from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402
from xgbuild.hw import load_profile  # noqa: E402
from xgbuild.settings import Settings  # noqa: E402
from xgbuild.tuner.cuda_measure import local_measurers  # noqa: E402
from xgbuild.tuner.link import build_kernels  # noqa: E402

GEMM = """extern Tensor[{dt}, M, K] A
extern Tensor[{dt}, K, N] B
def main() {{
    return A @ B
}}
"""
MLP = """extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, D, F] W1
extern Tensor[bfloat16, F] B1
extern Tensor[bfloat16, F, D] W2
def main() {
    return gelu(X @ W1 + B1) @ W2
}
"""
# GPT-2's tied LM head (V = 50257, odd) and its two gradients: B stored [N, K] as the embedding
# table is; the activations' gradient with an odd K; the table's with A read transposed (odd M).
LM_HEAD = """extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, V, D] W
def main() {
    return X @ transpose(W, 0, 1)
}
"""
LM_HEAD_DX = """extern Tensor[bfloat16, T, V] G
extern Tensor[bfloat16, V, D] W
def main() {
    return G @ W
}
"""
LM_HEAD_DW = """extern Tensor[bfloat16, T, V] G
extern Tensor[bfloat16, T, D] X
def main() {
    return transpose(G, 0, 1) @ X
}
"""
RMSNORM = """extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, D] G
def main() {
    return X * rsqrt(mean(X * X, dim=1, keepdim=true) + 1e-6) * G
}
"""
SOFTMAX = """extern Tensor[bfloat16, T, D] X
def main() {
    return softmax(X, dim=1)
}
"""
ATTENTION = """extern Tensor[bfloat16, B, H, S, E] Q
extern Tensor[bfloat16, B, H, S, E] K
extern Tensor[bfloat16, B, H, S, E] V
def main() {
    causal = reshape(arange(S), [S, 1]) >= reshape(arange(S), [1, S])
    scores = where(causal, cast(Q @ transpose(K, 2, 3), float32) * 0.08838834764831845, -1e9)
    return cast(softmax(scores, dim=3), bfloat16) @ V
}
"""


def _gemm(a, b):
    return a @ b


def _lm_head(x, w):
    return x @ w.T


def _lm_head_dw(g, x):
    return g.T @ x


def _mlp(x, w1, b1, w2):
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2


def _rmsnorm(x, g):
    return x * torch.rsqrt((x * x).mean(dim=1, keepdim=True) + 1e-6) * g


def _softmax(x):
    return torch.softmax(x, dim=1)


def _attention(q, k, v):
    s = q.shape[2]
    causal = torch.arange(s, device=q.device)[:, None] >= torch.arange(s, device=q.device)[None, :]
    scores = torch.where(causal, (q @ k.transpose(2, 3)).float() * 0.08838834764831845, -1e9)
    return torch.softmax(scores, dim=3).to(q.dtype) @ v


# name, source, dims, inputs (name -> shape), torch fn, flops, min bytes, dtype
def workloads():
    b2 = 2
    return [
        ("gemm 4096^3 bf16", GEMM.format(dt="bfloat16"), {"M": 4096, "K": 4096, "N": 4096},
         {"A": (4096, 4096), "B": (4096, 4096)}, _gemm, 2 * 4096**3, 3 * 4096 * 4096 * b2, torch.bfloat16),
        ("gemm decode 16x8192x8192", GEMM.format(dt="bfloat16"), {"M": 16, "K": 8192, "N": 8192},
         {"A": (16, 8192), "B": (8192, 8192)}, _gemm, 2 * 16 * 8192 * 8192,
         (16 * 8192 * 2 + 8192 * 8192) * b2, torch.bfloat16),
        ("MLP 8192x4096x11008", MLP, {"T": 8192, "D": 4096, "F": 11008},
         {"X": (8192, 4096), "W1": (4096, 11008), "B1": (11008,), "W2": (11008, 4096)}, _mlp,
         2 * 2 * 8192 * 4096 * 11008, (2 * 8192 * 4096 + 2 * 4096 * 11008 + 11008) * b2, torch.bfloat16),
        ("LM head 8192x768x50257", LM_HEAD, {"T": 8192, "D": 768, "V": 50257},
         {"X": (8192, 768), "W": (50257, 768)}, _lm_head, 2 * 8192 * 768 * 50257,
         (8192 * 768 + 50257 * 768 + 8192 * 50257) * b2, torch.bfloat16),
        ("LM head dX 8192x50257x768", LM_HEAD_DX, {"T": 8192, "D": 768, "V": 50257},
         {"G": (8192, 50257), "W": (50257, 768)}, _gemm, 2 * 8192 * 768 * 50257,
         (8192 * 768 + 50257 * 768 + 8192 * 50257) * b2, torch.bfloat16),
        ("LM head dW 50257x8192x768", LM_HEAD_DW, {"T": 8192, "D": 768, "V": 50257},
         {"G": (8192, 50257), "X": (8192, 768)}, _lm_head_dw, 2 * 8192 * 768 * 50257,
         (8192 * 768 + 50257 * 768 + 8192 * 50257) * b2, torch.bfloat16),
        ("RMSNorm 16384x4096", RMSNORM, {"T": 16384, "D": 4096}, {"X": (16384, 4096), "G": (4096,)}, _rmsnorm,
         4 * 16384 * 4096, (2 * 16384 * 4096 + 4096) * b2, torch.bfloat16),
        ("softmax 8192x8192", SOFTMAX, {"T": 8192, "D": 8192}, {"X": (8192, 8192)}, _softmax,
         5 * 8192 * 8192, 2 * 8192 * 8192 * b2, torch.bfloat16),
        ("naive causal attention B4 H32 S2048 D128", ATTENTION, {"B": 4, "H": 32, "S": 2048, "E": 128},
         {"Q": (4, 32, 2048, 128), "K": (4, 32, 2048, 128), "V": (4, 32, 2048, 128)}, _attention,
         4 * 4 * 32 * 2048 * 2048 * 128 / 2, 4 * 4 * 32 * 2048 * 128 * b2, torch.bfloat16),
        ("gemm 4096^3 fp32 (no TF32)", GEMM.format(dt="float32"), {"M": 4096, "K": 4096, "N": 4096},
         {"A": (4096, 4096), "B": (4096, 4096)}, _gemm, 2 * 4096**3, 3 * 4096 * 4096 * 4, torch.float32),
    ]


def _sdpa_ms(qkv: list, do_bench) -> dict[str, float | None]:
    """Causal attention of the workload's Q, K, V (same scale) through `F.scaled_dot_product_attention`
    pinned to each backend: its median ms, or None where the backend refuses these inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = qkv
    out: dict[str, float | None] = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
        def call():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                    scale=0.08838834764831845)
        try:
            with sdpa_kernel([backend]):        # (entered once: the timed calls pay no context switch)
                call()
                out[name] = do_bench(call, return_mode="median")
        except RuntimeError:
            out[name] = None
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(out).any():
        return math.inf
    return ((out.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", default="bench_kernels.json")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of measuring per tuning job")
    ap.add_argument("--policy", default="measure")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: bench_kernels times GPU kernels and this host has no GPU (torch.cuda.is_available() is "
              "False); run it on a GPU host", file=sys.stderr)
        return 1
    from triton.testing import do_bench
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(0)
    target = next((t for t in ("H200", "H100", "B200", "A100") if t in name), None)
    profile = load_profile(target)
    copy_bw = profile.measured.copy_bandwidth_bytes_per_s or profile.hbm_bandwidth_bytes_per_s
    peak = profile.measured.bf16_matmul_flops_per_s or profile.peak_flops_for("bfloat16")
    settings = Settings.from_env() if args.cache_dir is None else Settings(cache_dir=Path(args.cache_dir))
    cache = Cache.open(settings)
    measurers = local_measurers(profile) if args.policy == "measure" else []
    rows = []
    def run_one(wname, src, dims, shapes, fn, flops, nbytes, dtype):
        torch.manual_seed(0)
        inputs = {k: (torch.randn(s, device="cuda", dtype=torch.float32) * (0.5 if len(s) > 1 else 1.0)).to(dtype)
                  for k, s in shapes.items()}
        compiled = compile_source(src, "bench.xg")
        t0 = time.perf_counter()
        table = build_kernels(compiled.optimized.main, profile, policy=args.policy, cache=cache, dims=dims,
                              measurers=measurers, budget_s=args.budget, workers=16)
        build_s = time.perf_counter() - t0
        engine = engine_of(compiled, table, profile)
        graph = compiled.optimized.main
        sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in inputs.items()}))
        ex = engine.cuda_executor(check=False)
        ordered = [inputs[n] for n, _ in graph.inputs]
        ref = fn(*[t.double() for t in ordered]) if wname.startswith(("gemm", "MLP", "LM head")) else \
            fn(*[t.float() for t in ordered]).double()
        out = engine.run(inputs, device="cuda", check=False).tensors["out"]
        err = rel_err(out, ref)
        eager_err = rel_err(fn(*ordered), ref)
        kernels_ms = do_bench(lambda: ex.kernels.run(sg, inputs), return_mode="median")
        # The timed runs replay the first one's launches: check a replayed result too.
        replay_err = rel_err(next(iter(ex.kernels.run(sg, inputs).values())), ref)
        xg_ms = do_bench(lambda: xg.run_engine(engine, inputs, device="cuda"), return_mode="median")
        api_err = rel_err(xg.run_engine(engine, inputs, device="cuda").value, ref)
        nocheck_ms = do_bench(lambda: xg.run_engine(engine, inputs, device="cuda", check=False),
                              return_mode="median")
        eager_ms = do_bench(lambda: fn(*ordered), return_mode="median")
        compiled_fn = torch.compile(fn)
        compiled_fn(*ordered)
        compile_ms = do_bench(lambda: compiled_fn(*ordered), return_mode="median")
        sdpa = _sdpa_ms(ordered, do_bench) if wname.startswith("naive causal attention") else {}
        floor_ms = max(flops / (peak if dtype != torch.float32 else profile.peak_flops_for("float32")),
                       nbytes / copy_bw) * 1e3
        peers = {"eager": eager_ms, "torch.compile": compile_ms,
                 **{f"SDPA {b}": ms for b, ms in sdpa.items() if ms is not None}}
        best = min(peers, key=peers.__getitem__)
        return {"workload": wname, "xg_ms": xg_ms, "xg_nocheck_ms": nocheck_ms, "xg_kernels_ms": kernels_ms,
                "api_overhead": xg_ms / kernels_ms - 1, "eager_ms": eager_ms, "compile_ms": compile_ms,
                "sdpa_ms": sdpa, "best_peer": best, "best_peer_ms": peers[best],
                "floor_ms": floor_ms, "ratio_to_best_peer": xg_ms / peers[best],
                "pct_of_floor": 100 * floor_ms / xg_ms, "rel_err": err, "api_rel_err": api_err,
                "eager_rel_err": eager_err, "replay_rel_err": replay_err,
                "build_s": build_s, "kernels": table.stats,
                "tuning": [k["tuning"] for k in table.kernels]}

    for w in workloads():
        if args.only and not any(o in w[0] for o in args.only):
            continue
        row = run_one(*w)
        rows.append(row)
        r = row
        print(f"{r['workload']}: xg {r['xg_ms']:.3f} ms (checks off {r['xg_nocheck_ms']:.3f}, kernels alone "
              f"{r['xg_kernels_ms']:.3f}) eager {r['eager_ms']:.3f} compile {r['compile_ms']:.3f} sdpa {r['sdpa_ms']} "
              f"floor {r['floor_ms']:.3f} err {r['rel_err']:.2e} (replayed {r['replay_rel_err']:.2e}, through "
              f"xg.run_engine {r['api_rel_err']:.2e}, eager "
              f"{r['eager_rel_err']:.2e}); build {r['build_s']:.1f} s {r['kernels']}; configs "
              f"{[(t['config'], round(t['ms'], 4)) for t in r['tuning']]}", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    cache.close()
    print(f"\n{name}, torch {torch.__version__}")
    print("XG: xg.run_engine at its defaults (checks on); kernels alone: the executor's launch loop")
    print("| workload | XG | checks off | kernels alone | eager | compile | best peer | floor | XG / best peer "
          "| % of floor | rel err |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['workload']} | {r['xg_ms']:.3f} | {r['xg_nocheck_ms']:.3f} | {r['xg_kernels_ms']:.3f} | "
              f"{r['eager_ms']:.3f} | {r['compile_ms']:.3f} | {r['best_peer']} {r['best_peer_ms']:.3f} | "
              f"{r['floor_ms']:.3f} | {r['ratio_to_best_peer']:.2f}x | {r['pct_of_floor']:.0f}% | {r['rel_err']:.1e} |")
    Path(args.json).write_text(json.dumps({"gpu": name, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
