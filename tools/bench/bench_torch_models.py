"""A GPT-2-style decoder stack through `xg.compile`, beside PyTorch eager and `torch.compile`, on one GPU.

The model is examples/torch_models.py's GPT at benchmark sizes (random weights). XG compiles it for
the local GPU's profile (`--tune measure` by default: the tuner measures on this GPU and caches
winners), checks the engine's output against a float64 eager reference on the GPU, then times
three ways with `triton.testing.do_bench` (CUDA events, median): the engine called like the model
(`engine(idx)`: input checks, cached specialisation, kernel launches), the engine's kernels alone,
eager and `torch.compile` (default mode). Prints a table and writes JSON.

    python tools/bench/bench_torch_models.py [--dtype float32 bfloat16] [--batch 8] [--ctx 512]
        [--d 768] [--heads 12] [--layers 4] [--vocab 8192] [--policy measure] [--json out/bench_torch_models.json]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

import xg  # noqa: E402
from torch_models import GPT  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `least` (argparse's one-line error otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is less than {least}")
        return value
    return parse


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref).norm() / ref.norm()).item()


def local_target() -> str:
    name = torch.cuda.get_device_name(0)
    for target in ("H200", "H100", "B200", "A100", "L40S"):
        if target in name:
            return target
    raise SystemExit(f"no hw/ profile for {name}")


def run(args, dtype_name: str) -> dict:
    from triton.testing import do_bench
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    model = GPT(vocab=args.vocab, ctx=args.ctx, d=args.d, heads=args.heads, layers=args.layers).eval()
    idx = torch.randint(0, args.vocab, (args.batch, args.ctx))
    batch = torch.export.Dim("batch", min=1, max=4096)
    t0 = time.perf_counter()
    engine = xg.compile(model.to(dtype), (idx,), target=local_target(), tune=args.policy,
                        dynamic_shapes=({0: batch},))
    build_s = time.perf_counter() - t0
    model = model.cuda()
    idx = idx.cuda()
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(idx)
        out = engine(idx)
        err = rel_err(out, ref)
        eager_err = rel_err(model(idx), ref)

        inner = engine.engine
        inputs = inner.prepare_inputs({"idx": idx}, "cuda")
        graph = inner.graph
        sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in inputs.items()}))
        ex = inner.cuda_executor(check=False)
        engine.check = False
        xg_ms = do_bench(lambda: engine(idx), return_mode="median")
        ex.graphs = True                # XG_CUDA_GRAPHS=1: the run captured once, then replayed
        for _ in range(3):
            engine(idx)
        graphs_err = rel_err(engine(idx), ref)
        graphs_ms = do_bench(lambda: engine(idx), return_mode="median")
        captured = bool(ex._captured)
        ex.graphs = False
        del ref
        kernels_ms = do_bench(lambda: ex.kernels.run(sg, inputs), return_mode="median")
        eager_ms = do_bench(lambda: model(idx), return_mode="median")
        compiled = torch.compile(model)
        compiled(idx)
        compile_ms = do_bench(lambda: compiled(idx), return_mode="median")
    tokens = args.batch * args.ctx
    return {"dtype": dtype_name, "batch": args.batch, "ctx": args.ctx, "d": args.d, "heads": args.heads,
            "layers": args.layers, "vocab": args.vocab, "xg_ms": xg_ms, "xg_kernels_ms": kernels_ms,
            "xg_graphs_ms": graphs_ms, "graphs_captured": captured, "graphs_rel_err": graphs_err,
            "eager_ms": eager_ms, "compile_ms": compile_ms, "xg_over_eager": xg_ms / eager_ms,
            "xg_over_compile": xg_ms / compile_ms, "tokens_per_s": tokens / (xg_ms * 1e-3), "rel_err": err,
            "eager_rel_err": eager_err, "build_s": build_s, "kernels": len(inner.manifest["kernels"]),
            "launches": len(inner.manifest["launches"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", nargs="*", default=["float32", "bfloat16"], choices=sorted(DTYPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--policy", default="measure", choices=["measure", "cache", "predict"])
    ap.add_argument("--json", default=str(REPO / "out" / "bench_torch_models.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False       # XG's fp32 matmuls are IEEE; so are the peers'
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for dt in args.dtype:
        row = run(args, dt)
        rows.append(row)
        print(f"{dt}: xg {row['xg_ms']:.3f} ms (kernels {row['xg_kernels_ms']:.3f}, CUDA graph "
              f"{row['xg_graphs_ms']:.3f}{'' if row['graphs_captured'] else ' NOT captured'}, err "
              f"{row['graphs_rel_err']:.1e}) eager {row['eager_ms']:.3f} "
              f"compile {row['compile_ms']:.3f}; err {row['rel_err']:.2e} (eager {row['eager_rel_err']:.2e}); "
              f"build {row['build_s']:.1f} s, {row['kernels']} kernels, {row['launches']} launches", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(0)
    print(f"\nGPT-style stack: batch {args.batch}, ctx {args.ctx}, d {args.d}, {args.heads} heads, {args.layers} "
          f"layers, vocab {args.vocab}; {name}, torch {torch.__version__}")
    print("| dtype | XG engine(idx) ms | XG CUDA graph ms | XG kernels ms | eager ms | torch.compile ms | XG / eager "
          "| XG / compile | rel err (eager) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['dtype']} | {r['xg_ms']:.3f} | {r['xg_graphs_ms']:.3f} | {r['xg_kernels_ms']:.3f} | {r['eager_ms']:.3f} | "
              f"{r['compile_ms']:.3f} | {r['xg_over_eager']:.2f}x | {r['xg_over_compile']:.2f}x | "
              f"{r['rel_err']:.1e} ({r['eager_rel_err']:.1e}) |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": name, "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
