"""Cold tuning: XG's `--tune=measure` build beside `torch.compile(mode="max-autotune")`'s first call,
each in a fresh process with empty caches (XG's, Triton's, Inductor's), on this host's GPUs: issue
24's benchmark.

Workloads: the MLP `gelu(x@W1+b1)@W2` at 8192x4096x11008, naive causal attention B4 H32 S2048
D128 (both bf16, written in XG and built as `xgc --tune=measure` builds them, `xg.compile_file`),
and transformers' GPT2LMHeadModel (12 layers, batch 8 x 512, bf16) through `xg.compile`. Modes:

- `xg`: XG as it tunes by default (the search stops at the model's bound, losers raced), the build
  timed in the process, after `import torch` and CUDA's start, as torch.compile's first call is;
- `xgc`: the same build through the `xgc` CLI in a process of its own (its start-up included);
- `exhaustive`: `XG_TUNE_EXHAUSTIVE=1`, every candidate compiled and timed 50 times: how XG tuned
  before; its winners are the "today's" kernels the new search must not be slower than, and its
  per-candidate timings are the fixture `tests/unit/tuner/test_search.py` holds the bound to;
- `autotune`: `torch.compile(mode="max-autotune")`, time to the first result.

Each row is the child process's wall time (imports included, as a user waits for it) and the
build's own time inside it. `--gpus 1 2` also tunes a stack of 48 matmuls of distinct shapes
(`chain`: 48 jobs, `--chain-jobs`) on 1 and on 2 GPUs (cold, and
with Triton's cache warm so that measuring, not compiling, is what scales) and reports jobs per
minute. Prints a table and writes JSON (and `--fixture`: every candidate's predicted and measured
time from the exhaustive runs).

    python tools/bench/bench_tuning.py [--workloads mlp attention gpt2] [--modes xg exhaustive autotune]
        [--gpus 1 2] [--json out/bench_tuning.json] [--fixture out/tuning_fixture.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import ATTENTION, MLP, RMSNORM, SOFTMAX  # noqa: E402  (the same workloads, same sources)

XG_WORKLOADS = {
    "mlp": (MLP, {"T": 8192, "D": 4096, "F": 11008}),
    "attention": (ATTENTION, {"B": 4, "H": 32, "S": 2048, "E": 128}),
    "rmsnorm": (RMSNORM, {"T": 16384, "D": 4096}),
    "softmax": (SOFTMAX, {"T": 8192, "D": 8192}),
}


def _chain(widths: list[int]) -> str:
    """A stack of bf16 matmuls of distinct shapes: one tuning job each (the GPU-scaling workload)."""
    lines = ["extern Tensor[bfloat16, T, W0] X"] + [f"extern Tensor[bfloat16, W{i}, W{i + 1}] M{i + 1}"
                                                  for i in range(len(widths) - 1)]
    body = "X" + "".join(f" @ M{i + 1}" for i in range(len(widths) - 1))
    return "\n".join(lines) + f"\ndef main() {{\n    return {body}\n}}\n"


def chain_workload(jobs: int) -> tuple[str, dict]:
    widths = [1024 + (6144 // jobs) * i for i in range(jobs + 1)]
    return _chain(widths), {"T": 8192, **{f"W{i}": w for i, w in enumerate(widths)}}


XG_WORKLOADS["chain"] = chain_workload(int(os.environ.get("XG_BENCH_CHAIN_JOBS", "48")))
WORKLOADS = (*XG_WORKLOADS, "gpt2")


def _pythonpath() -> str:
    return os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))


def local_target() -> str:
    import torch
    name = torch.cuda.get_device_name(0)
    for target in ("H200", "H100", "B200", "A100"):
        if target in name:
            return target
    raise SystemExit(f"no hw/ profile for {name}")


# --- children: one cold build each, in its own process ------------------------------------------

def _torch_fn(workload: str):
    """(callable, inputs) of a workload in PyTorch, bf16 on the GPU."""
    import torch
    torch.manual_seed(0)
    bf = dict(dtype=torch.bfloat16, device="cuda")
    if workload == "mlp":
        def fn(x, w1, b1, w2):
            return torch.nn.functional.gelu(x @ w1 + b1) @ w2
        return fn, [torch.randn(8192, 4096, **bf), torch.randn(4096, 11008, **bf) * 0.02,
                    torch.randn(11008, **bf), torch.randn(11008, 4096, **bf) * 0.02]
    if workload == "attention":
        def fn(q, k, v):
            s = q.shape[2]
            causal = torch.arange(s, device=q.device)[:, None] >= torch.arange(s, device=q.device)[None, :]
            scores = torch.where(causal, (q @ k.transpose(2, 3)).float() * 0.08838834764831845, -1e9)
            return torch.softmax(scores, dim=3).to(q.dtype) @ v
        return fn, [torch.randn(4, 32, 2048, 128, **bf) for _ in range(3)]
    if workload == "rmsnorm":
        def fn(x, g):
            return x * torch.rsqrt((x * x).mean(dim=1, keepdim=True) + 1e-6) * g
        return fn, [torch.randn(16384, 4096, **bf), torch.randn(4096, **bf)]
    if workload == "softmax":
        return (lambda x: torch.softmax(x, dim=1)), [torch.randn(8192, 8192, **bf)]
    raise SystemExit(f"unknown workload {workload}")


def _gpt2(layers: int):
    import torch
    import transformers as T
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    model = T.GPT2LMHeadModel(cfg).eval()
    model.config.use_cache = False
    model = model.to(torch.bfloat16).cuda()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _tuning_rows(manifest: dict) -> list[dict]:
    return [{"job": k["id"], "kind": k["kind"], **{f: k["tuning"].get(f) for f in ("source", "config", "ms", "search")}}
            for k in manifest.get("kernels", [])]


def _fixture_rows() -> list[dict]:
    """Every measured record in this process's XG cache, with its per-candidate timings."""
    sys.path.insert(0, str(REPO))
    from xgbuild.cache import Cache
    from xgbuild.cache.canonical import thaw
    from xgbuild.cache.forensics import kernel_summary
    from xgbuild.settings import Settings
    cache = Cache.open(Settings.from_env())
    rows = []
    try:
        for record in cache.local.records():
            value = thaw(record.value)
            if not isinstance(value, dict) or value.get("how") != "measured" or not value.get("timings"):
                continue
            summary = kernel_summary(record.key)
            rows.append({"op": summary.get("op"), "shape": summary.get("shape"), "dtype": summary.get("dtype"),
                         "gpu": value.get("measured_on"), "winner": value["config"], "ms": value["ms"],
                         "candidates": value["timings"]})
    finally:
        cache.close()
    return rows


def child(mode: str, workload: str, result: Path, layers: int) -> None:
    t_import = time.perf_counter()
    import torch
    out: dict = {"mode": mode, "workload": workload}
    if mode == "autotune":
        if workload == "gpt2":
            model, kw = _gpt2(layers)
            run = torch.compile(model, mode="max-autotune")
            t0 = time.perf_counter()
            with torch.no_grad():
                run(**kw)
        else:
            fn, inputs = _torch_fn(workload)
            run = torch.compile(fn, mode="max-autotune")
            t0 = time.perf_counter()
            run(*inputs)
        torch.cuda.synchronize()
        out["build_s"] = time.perf_counter() - t0
    else:
        sys.path.insert(0, str(REPO))
        target = local_target()
        t0 = time.perf_counter()
        if workload == "gpt2":
            import warnings
            import xg
            model, kw = _gpt2(layers)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                engine = xg.compile(model, example_kwargs=kw, target=target, tune="measure")
            out["build_s"] = time.perf_counter() - t0
            manifest = engine.engine.manifest
        elif mode == "xgc":             # the CLI in a process of its own: its start-up included
            from xgbuild.runtime.engine import Engine
            src, dims = XG_WORKLOADS[workload]
            tmp = Path(tempfile.mkdtemp())
            (tmp / "w.xg").write_text(src)
            cmd = [sys.executable, "-c", "from xgbuild.cli.xgc import main; main()", str(tmp / "w.xg"),
                   f"--target={target}", "--tune=measure", "--out", str(tmp / "w.xge"), "--json",
                   *[f"--dim={k}={v}" for k, v in dims.items()]]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
            if proc.returncode:
                raise SystemExit(f"xgc failed ({proc.returncode}): {proc.stderr[-2000:]}")
            out["build_s"] = time.perf_counter() - t0
            out["xgc"] = json.loads(proc.stdout).get("kernels")
            manifest = Engine.load(tmp / "w.xge").manifest
        else:                           # the build `xgc --tune=measure` runs (`xg.compile_file`), in this process
            from xgbuild.build.compile import compile_program
            from xgbuild.build.context import early_start
            from xgbuild.build.engines import link_engine
            from xgbuild.compiler.frontend import CheckOptions
            from xgbuild.settings import Settings
            src, dims = XG_WORKLOADS[workload]
            tmp = Path(tempfile.mkdtemp())
            (tmp / "w.xg").write_text(src)
            torch.zeros(1, device="cuda")   # CUDA up, as for torch.compile's row (its inputs are on the GPU)
            t0 = time.perf_counter()
            settings = Settings.from_env()
            options = CheckOptions(target=target, hw_dir=settings.hw_dir)
            with early_start("measure", target, settings) as early:       # as xgc and xg.compile_file do
                built = link_engine(compile_program(tmp / "w.xg", options), settings, policy="measure", dims=dims,
                                    early=early)
            out["build_s"] = time.perf_counter() - t0
            out["xgc"] = built.stats
            manifest = built.engine.manifest
        out["jobs"] = _tuning_rows(manifest)
        if mode == "exhaustive":
            out["fixture"] = _fixture_rows()
    out["process_s_before_build"] = t0 - t_import
    result.write_text(json.dumps(out))


# --- the parent ---------------------------------------------------------------------------------

def cold_run(mode: str, workload: str, layers: int, gpus: str | None = None,
             triton_cache: Path | None = None) -> dict:
    """One child in a fresh process with empty caches (Triton's: `triton_cache` when given)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"xg-tune-{mode}-{workload}-"))
    env = {**os.environ, "XG_CACHE_DIR": str(tmp / "xg"), "TRITON_CACHE_DIR": str(triton_cache or tmp / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "PYTHONPATH": _pythonpath()}
    env.pop("XG_TUNE_EXHAUSTIVE", None)
    if mode == "exhaustive":
        env["XG_TUNE_EXHAUSTIVE"] = "1"
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    result = tmp / "result.json"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", mode, workload, str(result), "--gpt2-layers",
                           str(layers)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        return {"mode": mode, "workload": workload, "error": proc.stderr[-3000:], "wall_s": wall}
    row = json.loads(result.read_text())
    row["wall_s"] = wall
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def _kernel_ms(row: dict) -> float | None:
    jobs = row.get("jobs")
    return sum(j["ms"] for j in jobs if j.get("ms") is not None) if jobs else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=3, metavar=("MODE", "WORKLOAD", "RESULT"))
    ap.add_argument("--workloads", nargs="*", default=["mlp", "attention", "gpt2"], choices=WORKLOADS)
    ap.add_argument("--modes", nargs="*", default=["xg", "exhaustive", "autotune"],
                    choices=["xg", "xgc", "exhaustive", "autotune"])
    ap.add_argument("--gpt2-layers", type=int, default=12)
    ap.add_argument("--gpus", nargs="*", type=int, default=[], help="also tune GPT-2 on these many GPUs (1 2)")
    ap.add_argument("--scaling-workload", default="chain", choices=WORKLOADS)
    ap.add_argument("--scaling-caches", nargs="*", default=["cold", "triton-warm"], choices=["cold", "triton-warm"],
                    help="Triton's cache for the scaling runs: empty (cold) and/or warmed by a first run")
    ap.add_argument("--chain-jobs", type=int, default=48, help="matmuls (jobs) in the `chain` workload")
    ap.add_argument("--json", default="bench_tuning.json")
    ap.add_argument("--fixture", default=None, help="write the exhaustive runs' per-candidate timings here")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]), args.gpt2_layers)
        return 0
    os.environ["XG_BENCH_CHAIN_JOBS"] = str(args.chain_jobs)       # the children build the same chain
    import torch
    device = torch.cuda.get_device_name(0)
    print(f"{device} x{torch.cuda.device_count()}, torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    rows = []
    for w in args.workloads:
        for mode in args.modes:
            row = cold_run(mode, w, args.gpt2_layers, gpus="0")
            rows.append(row)
            print(f"{w} {mode}: wall {row['wall_s']:.1f} s" + (f", build {row['build_s']:.1f} s" if "build_s" in row
                                                               else f" FAILED: {row.get('error', '')[-1500:]}")
                  + (f", kernels {_kernel_ms(row):.4f} ms" if _kernel_ms(row) else "")
                  + (f", {row['xgc']}" if row.get("xgc") else ""), flush=True)
    scaling = []
    for n in args.gpus:
        if n > torch.cuda.device_count():
            print(f"scaling: {n} GPUs asked for, {torch.cuda.device_count()} present: skipped")
            continue
        warm = Path(tempfile.mkdtemp(prefix="xg-triton-warm-"))
        if "triton-warm" in args.scaling_caches:        # warms Triton's cache
            cold_run("xg", args.scaling_workload, args.gpt2_layers, gpus="0", triton_cache=warm)
        for label, cache in (("cold", None), ("triton-warm", warm)):
            if label not in args.scaling_caches:
                continue
            row = cold_run("xg", args.scaling_workload, args.gpt2_layers, gpus=",".join(map(str, range(n))),
                           triton_cache=cache)
            measured = [j for j in row.get("jobs", []) if j.get("source") == "measured"]
            tuned_s = (row.get("xgc") or {}).get("tune_s") or row.get("build_s")      # xgc: the jobs' tuning
            row.update(gpus=n, label=label, measured_jobs=len(measured), tuned_s=tuned_s,
                       jobs_per_min=60 * len(measured) / tuned_s if tuned_s else None)
            scaling.append(row)
            print(f"scaling {label} {n} GPU(s): {len(measured)} jobs in {tuned_s or float('nan'):.1f} s "
                  f"-> {row['jobs_per_min'] or 0:.1f} jobs/min"
                  + "".join(f", {k} {(row.get('xgc') or {})[k]}" for k in ("by_gpu", "gpu_start_s", "search_s")
                            if k in (row.get("xgc") or {})), flush=True)
        shutil.rmtree(warm, ignore_errors=True)

    print(f"\n{device}, torch {torch.__version__}; cold caches, fresh processes; seconds")
    print("| workload | XG cold (wall / build) | xgc CLI (wall / process) | XG exhaustive (wall / build) | "
          "max-autotune (wall / first call) | XG / max-autotune (build) | kernels XG / exhaustive (ms) | "
          "compiled / measured / pruned |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in args.workloads:
        by = {r["mode"]: r for r in rows if r["workload"] == w}

        def cell(m: str) -> str:
            r = by.get(m)
            return "—" if r is None or "build_s" not in r else f"{r['wall_s']:.1f} / {r['build_s']:.1f}"
        xgr, ex, at = by.get("xg", {}), by.get("exhaustive", {}), by.get("autotune", {})
        ratio = f"{xgr['build_s'] / at['build_s']:.2f}x" if "build_s" in xgr and "build_s" in at else "—"
        kx, ke = _kernel_ms(xgr), _kernel_ms(ex)
        kern = f"{kx:.4f} / {ke:.4f}" if kx and ke else (f"{kx:.4f} / —" if kx else "—")
        s = (xgr.get("xgc") or {}).get("search") or {}
        if not s and xgr.get("jobs"):
            s = {k: sum((j.get("search") or {}).get(k, 0) for j in xgr["jobs"]) for k in ("compiled", "measured", "pruned")}
        counts = f"{s.get('compiled', '—')} / {s.get('measured', '—')} / {s.get('pruned', '—')}" if s else "—"
        print(f"| {w} | {cell('xg')} | {cell('xgc')} | {cell('exhaustive')} | {cell('autotune')} | {ratio} | {kern} "
              f"| {counts} |")
    for w in args.workloads:
        by = {r["mode"]: r for r in rows if r["workload"] == w}
        if "jobs" in by.get("xg", {}) and "jobs" in by.get("exhaustive", {}):
            old = {j["job"]: j for j in by["exhaustive"]["jobs"]}
            print(f"\n{w}: winners per job (ms): new search vs exhaustive")
            for j in by["xg"]["jobs"]:
                o = old.get(j["job"], {})
                print(f"  {j['job'][:70]}: {j['ms']:.4f} vs {o.get('ms', float('nan')):.4f}"
                      f"{'' if j['config'] == o.get('config') else ' (other config)'}")
    if scaling:
        print(f"\n{args.scaling_workload}: the jobs' tuning time (xgc's `tune_s`), fresh XG cache each")
        print("| Triton cache | GPUs | measured jobs | seconds | jobs / min | scaling |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in scaling:
            base = next((b for b in scaling if b["label"] == r["label"] and b["gpus"] == 1), None)
            up = f"{r['jobs_per_min'] / base['jobs_per_min']:.2f}x" if base and r.get("jobs_per_min") and \
                base.get("jobs_per_min") else "—"
            print(f"| {r['label']} | {r['gpus']} | {r['measured_jobs']} | {r.get('tuned_s') or float('nan'):.1f} | "
                  f"{r['jobs_per_min'] or 0:.1f} | {up} |")
    fixture = [f for r in rows for f in r.pop("fixture", [])]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"device": device, "torch": torch.__version__, "cpus": os.cpu_count(),
                                           "rows": rows, "scaling": scaling}, indent=1))
    if args.fixture:
        Path(args.fixture).write_text(json.dumps({"device": device, "jobs": fixture}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
