"""Fresh process to first correct result (issue 22): XG's deploy runtime beside torch.compile with a
warm cache and AOTInductor, for the MLP (8192 x 4096 x 11008 bf16, inputs in one safetensors file)
and the GPT-2 engine of the model-speed issue (12 layers, 8 x 512 tokens, bf16).

Each row is a new process that reads the same inputs file, computes, copies the result to the
host and writes it; the wall time is from starting the process to its exit, the median of `--runs`
(after one untimed run that warms the OS page cache and, for torch.compile, Inductor's cache):

- `xgrun native`: `xgrun --runtime native --device cuda` with torch and Triton made unimportable;
- `xgrun torch`: the torch-backed runtime (`--runtime torch`), for reference;
- `torch.compile warm`: the model built in the process, `torch.compile` (default mode), one call;
- `AOTInductor`: `torch._inductor.aoti_load_package` of a package made beforehand, one call.

A result counts when it is correct: XG's two runtimes bit for bit equal, the others within bf16
noise of eager PyTorch (relative error < 2e-2). Installed size: the distributions each kind of
process imported (from `importlib.metadata`), summed over their files.

    python tools/bench/bench_startup.py [--models mlp gpt2] [--runs 3] [--json out/bench_startup.json]
        [--gpt2-layers 12] [--policy cache]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

XGRUN = textwrap.dedent("""
    import time
    t0, t0_epoch = time.perf_counter(), time.time()
    import atexit, json, os, sys
    atexit.register(lambda: open(os.environ["XG_BENCH_MODULES"], "w").write(json.dumps(
        {"modules": sorted(sys.modules), "import_ms": (t1 - t0) * 1e3, "started": t0_epoch, "ended": time.time()})))
    sys.argv[0] = "xgrun"
    from xgbuild.cli.xgrun import main
    t1 = time.perf_counter()
    main()
""")
BLOCKED_XGRUN = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ModuleNotFoundError(f"No module named {name!r} (a deploy host without torch)", name=name)
            return None
    sys.meta_path.insert(0, Block())
    import time
    t0, t0_epoch = time.perf_counter(), time.time()
    sys.argv[0] = "xgrun"
    import atexit, json, os
    atexit.register(lambda: open(os.environ["XG_BENCH_MODULES"], "w").write(json.dumps(
        {"modules": sorted(sys.modules), "import_ms": (t1 - t0) * 1e3, "started": t0_epoch, "ended": time.time()})))
    from xgbuild.cli.xgrun import main
    t1 = time.perf_counter()
    main()
""")

TORCH_CHILD = textwrap.dedent("""
    import atexit, json, os, sys
    atexit.register(lambda: open(os.environ["XG_BENCH_MODULES"], "w").write(json.dumps({"modules": sorted(sys.modules)})))
    mode, model, inputs, out, extra = sys.argv[1:6]
    import torch
    import safetensors.torch
    kw = {k: v.cuda() for k, v in safetensors.torch.load_file(inputs).items()}
    if mode == "aoti":
        run = torch._inductor.aoti_load_package(extra)
        with torch.no_grad():
            y = run(*[kw[k] for k in sorted(kw)])
    else:
        sys.path.insert(0, os.environ["XG_BENCH_DIR"])
        from bench_startup import torch_model
        fn, _module = torch_model(model, int(extra))
        with torch.no_grad():
            y = torch.compile(fn)(**kw)
    y = y[0] if isinstance(y, (tuple, list)) else y
    y = getattr(y, "logits", y)
    safetensors.torch.save_file({"out": y.float().cpu().contiguous()}, out)
""")


def torch_model(name: str, layers: int):
    """(function of the inputs, its nn.Module or None): the PyTorch side of each workload, with the
    same weights every time it is built (seeded)."""
    import torch
    torch.manual_seed(0)
    if name == "mlp":
        def mlp(X, W1, B1, W2):
            return torch.nn.functional.gelu(X @ W1 + B1) @ W2
        return mlp, None
    import transformers as T
    cfg = T.GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    model = T.GPT2LMHeadModel(cfg).to(torch.bfloat16).cuda().eval()
    model.config.use_cache = False

    def fn(input_ids):
        return model(input_ids=input_ids).logits
    return fn, model


def _inputs(name: str) -> dict:
    import torch
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        return {"X": torch.randn(8192, 4096, generator=g).to(torch.bfloat16),
                "W1": (torch.randn(4096, 11008, generator=g) / 64).to(torch.bfloat16),
                "B1": torch.randn(11008, generator=g).to(torch.bfloat16),
                "W2": (torch.randn(11008, 4096, generator=g) / 105).to(torch.bfloat16)}
    return {"input_ids": torch.randint(0, 50257, (8, 512), generator=g)}


MLP_XG = """
extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, D, F] W1
extern Tensor[bfloat16, F] B1
extern Tensor[bfloat16, F, D] W2
def main() {
    return gelu(X @ W1 + B1) @ W2
}
"""


def prepare(name: str, tmp: Path, policy: str, layers: int, aoti: bool = True) -> dict:
    """The engine, the inputs file, the AOTInductor package and eager PyTorch's result."""
    import torch
    import xg
    from bench_torch_models import local_target
    from xgbuild.runtime.tensor_io import save_tensors
    inputs = _inputs(name)
    save_tensors(tmp / f"{name}.in.safetensors", inputs)
    fn, module = torch_model(name, layers)
    kw = {k: v.cuda() for k, v in inputs.items()}
    with torch.no_grad():
        ref = fn(**kw).float().cpu()
    engine = tmp / f"{name}.xge"
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "mlp":
            (tmp / "mlp.xg").write_text(MLP_XG)
            xg.compile_file(tmp / "mlp.xg", target=local_target(), tune=policy,
                            dims={"T": 8192, "D": 4096, "F": 11008}).save(engine)
        else:
            xg.compile(module, example_kwargs=kw, target=local_target(), tune=policy).save(engine)
    build_s = time.perf_counter() - t0

    class Wrap(torch.nn.Module):
        """The workload as a module of positional inputs (sorted by name), as AOTInductor exports it."""
        def __init__(self, f, owner):
            super().__init__()
            self.f, self.owner = f, owner       # (the model's parameters become the package's)

        def forward(self, *args):
            return self.f(**dict(zip(sorted(kw), args)))
    pt2 = tmp / f"{name}.pt2"
    t0 = time.perf_counter()
    if aoti:
        with torch.no_grad():
            exported = torch.export.export(Wrap(fn, module), args=tuple(kw[k] for k in sorted(kw)))
            torch._inductor.aoti_compile_and_package(exported, package_path=str(pt2))
    aoti_s = time.perf_counter() - t0
    return {"engine": engine, "inputs": tmp / f"{name}.in.safetensors", "ref": ref, "pt2": pt2,
            "build_s": build_s, "aoti_build_s": aoti_s}


def child(kind: str, name: str, prep: dict, out: Path, layers: int, env: dict) -> tuple[float, dict]:
    """(wall seconds, what the process said: its modules; xgrun's import time and phases)."""
    mods = out.with_suffix(".modules.json")
    env = {**env, "XG_BENCH_MODULES": str(mods), "XG_BENCH_DIR": str(Path(__file__).resolve().parent)}
    if kind.startswith("xgrun"):
        runtime = kind.split()[1]
        cmd = [sys.executable, "-c", BLOCKED_XGRUN if runtime == "native" else XGRUN]
        cmd += [str(prep["engine"]), "--device", "cuda", "--runtime", runtime, "--inputs", str(prep["inputs"]),
                "--output", str(out), "--json"]
    else:
        cmd = [sys.executable, "-X", "faulthandler", "-c", TORCH_CHILD, "aoti" if kind == "AOTInductor" else "compile", name,
               str(prep["inputs"]), str(out), str(prep["pt2"]) if kind == "AOTInductor" else str(layers)]
    t0, t0_epoch = time.perf_counter(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall, end_epoch = time.perf_counter() - t0, time.time()
    if proc.returncode:
        raise RuntimeError(f"{kind} {name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    said = json.loads(mods.read_text())
    if kind.startswith("xgrun"):
        said["phases_ms"] = json.loads(proc.stdout).get("phases_ms")
        # the interpreter's start (to the first line of the script) and its exit (after the last)
        said["start_ms"] = (said.pop("started") - t0_epoch) * 1e3
        said["exit_ms"] = (end_epoch - said.pop("ended")) * 1e3
    return wall, said


KINDS = ["xgrun native", "xgrun torch", "torch.compile warm", "AOTInductor"]


def installed_bytes(modules: list[str]) -> tuple[int, list[str]]:
    """Bytes of the distributions (installed files) whose top-level modules a process imported;
    XG's own package counted by its directory when it is not installed as a distribution."""
    import importlib.metadata as md
    tops = {m.split(".")[0] for m in modules}
    by_top = md.packages_distributions()
    dists = sorted({d for t in tops for d in by_top.get(t, [])})
    total = 0
    for d in dists:
        for f in md.distribution(d).files or []:
            try:
                total += f.locate().stat().st_size
            except OSError:
                pass
    if "xgbuild" in tops and not any(d.lower() == "xg" for d in dists):
        total += sum(p.stat().st_size for p in (REPO / "xgbuild").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        dists.append("xg (source tree)")
    if "torch" in tops:     # torch loads the CUDA libraries of the nvidia-* wheels as shared objects
        extra = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].startswith("nvidia-")]
        for d in sorted(set(extra) - set(dists)):
            total += sum(f.locate().stat().st_size for f in md.distribution(d).files or [] if f.locate().exists())
            dists.append(d)
    return total, dists


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["mlp", "gpt2"], choices=["mlp", "gpt2"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kinds", nargs="*", default=KINDS, choices=KINDS,
                    help="which processes to time (default: all four)")
    ap.add_argument("--gpt2-layers", type=int, default=12)
    ap.add_argument("--policy", default="cache", choices=["cache", "predict", "measure"])
    ap.add_argument("--json", default="out/bench_startup.json")
    args = ap.parse_args()
    import torch
    from xgbuild.runtime.tensor_io import load_tensors
    device = torch.cuda.get_device_name(0)
    tmp = Path(tempfile.mkdtemp(prefix="xg-startup-"))
    # Bytecode: an installed package carries it (pip compiles at install), but a source tree or a
    # read-only environment installed with --no-compile makes every process compile its imports
    # again (0.4 s of the native row on the device host). Each child gets a writable bytecode
    # cache, filled by the untimed first run, as an installed package's would be; the same for all.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "TRITON_CACHE_DIR": str(tmp / "triton"),
           "PYTHONPYCACHEPREFIX": str(tmp / "pycache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    kinds = args.kinds
    rows, sizes = [], {}
    for name in args.models:
        prep = prepare(name, tmp, args.policy, args.gpt2_layers, aoti="AOTInductor" in kinds)
        print(f"{name}: engine built in {prep['build_s']:.1f} s ({args.policy}), AOTInductor package in "
              f"{prep['aoti_build_s']:.1f} s", flush=True)
        results = {}
        for kind in kinds:
            out = tmp / f"{name}.{kind.replace(' ', '_')}.safetensors"
            walls, said = [], {}
            try:
                child(kind, name, prep, out, args.gpt2_layers, env)       # warms page cache / Inductor's cache
                for _ in range(args.runs):
                    wall, said = child(kind, name, prep, out, args.gpt2_layers, env)
                    walls.append(wall)
            except RuntimeError as exc:
                print(f"  {kind}: {exc}", flush=True)
                rows.append({"model": name, "kind": kind, "error": str(exc)[-2000:], "correct": False})
                continue
            modules = said["modules"]
            outs = load_tensors(out)
            got = (outs["out"] if "out" in outs else outs[sorted(outs)[0]]).float()
            results[kind] = got
            ref = prep["ref"]
            err = float((got.double() - ref.double()).norm() / ref.double().norm())
            if kind not in sizes:
                sizes[kind] = installed_bytes(modules)
            row = {"model": name, "kind": kind, "walls_s": walls, "median_s": statistics.median(walls),
                   "rel_err_vs_eager": err, "torch_loaded": "torch" in {m.split(".")[0] for m in modules},
                   "import_ms": said.get("import_ms"), "phases_ms": said.get("phases_ms"),
                   "start_ms": said.get("start_ms"), "exit_ms": said.get("exit_ms")}
            rows.append(row)
            print(f"  {kind:20s} median {row['median_s']:.2f} s of {[round(w, 2) for w in walls]}, "
                  f"rel err vs eager {err:.2e}, torch loaded: {row['torch_loaded']}"
                  + (f", start {row['start_ms']:.0f} ms, import {row['import_ms']:.0f} ms, exit {row['exit_ms']:.0f} ms, "
                     "phases (ms) "
                     f"{ {k: round(v) for k, v in (row['phases_ms'] or {}).items()} }" if row["import_ms"] else ""),
                  flush=True)
        # XG's two runtimes also bit for bit equal, where both ran
        same = "xgrun native" not in results or "xgrun torch" not in results or \
            torch.equal(results["xgrun native"], results["xgrun torch"])
        for r in rows:
            if r["model"] == name and "error" not in r:
                r["correct"] = r["rel_err_vs_eager"] < 2e-2 and (same or not r["kind"].startswith("xgrun"))
    print(f"\n{device}, torch {torch.__version__}; fresh process to first correct result, median of {args.runs}; seconds")
    print("| model | xgrun native (no torch) | xgrun torch | torch.compile warm | AOTInductor | native vs torch.compile |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        by = {r["kind"]: r for r in rows if r["model"] == name}

        def cell(k: str) -> str:
            r = by.get(k)
            if r is None:
                return "not run"
            if "error" in r:
                return "failed"
            return f"{r['median_s']:.2f}" + ("" if r["correct"] else " (WRONG)")
        ok = all("median_s" in by.get(k, {}) for k in ("torch.compile warm", "xgrun native"))
        ratio = by["torch.compile warm"]["median_s"] / by["xgrun native"]["median_s"] if ok else float("nan")
        print(f"| {name} | {cell('xgrun native')} | {cell('xgrun torch')} | {cell('torch.compile warm')} | "
              f"{cell('AOTInductor')} | {ratio:.1f}x faster |")
    print("\n| process | installed size (MB) | distributions |")
    print("| --- | --- | --- |")
    for kind, (n, dists) in sizes.items():
        print(f"| {kind} | {n / 2**20:.0f} | {', '.join(dists[:12])}{' ...' if len(dists) > 12 else ''} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"device": device, "torch": torch.__version__, "runs": args.runs,
                                           "rows": rows, "sizes": {k: {"bytes": v[0], "distributions": v[1]}
                                                                   for k, v in sizes.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
