"""A model's engine profiled by `xgrun --profile --trace` (issue 22: what a performance engineer
reads): builds the model from its `transformers` config (random weights, no downloads) with
`xg.compile`, saves the engine and its inputs, then runs the installed `xgrun` on them in a fresh
process, as a deploy host would, and prints its profile: a row per kernel with p50/p95/p99, share
of the run, bytes, FLOPs, % of the target's roofline and the source it came from, and the host's
share. Writes the Chrome trace and the JSON summary.

    python tools/bench/profile_engine.py [--model gpt2] [--layers N] [--batch 8] [--seq 512]
        [--dtype bfloat16] [--policy cache|predict|measure] [--device cuda|cpu]
        [--warmup 3] [--iterations 20] [--out out/profile] [--runtime auto|torch|native]

`--device cpu` profiles the CPU reference path (an engine without kernels): a smoke test of the
same steps on a host without a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import xg  # noqa: E402
from bench_models import MODELS, _cast, build  # noqa: E402  (the same models and inputs)
from bench_torch_models import DTYPES, local_target  # noqa: E402

from xgbuild.runtime.profile import render  # noqa: E402
from xgbuild.runtime.tensor_io import save_tensors  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=MODELS)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    ap.add_argument("--policy", default="cache", choices=["cache", "predict", "measure"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--out", default="out/profile")
    ap.add_argument("--runtime", default="auto", choices=["auto", "torch", "native"],
                    help="xgrun's runtime: native is the deploy runtime (no torch)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, make_inputs = build(args.model, args.layers, device=args.device)
    dtype = DTYPES[args.dtype]
    model = model.to(dtype).to(args.device)
    kw = _cast(make_inputs(args), dtype)
    cpu = args.device == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(model, example_kwargs=kw, target="H100" if cpu else local_target(), tune=args.policy,
                            kernels=not cpu)
    path, inputs, trace = out / f"{args.model}.xge", out / f"{args.model}.inputs.safetensors", out / f"{args.model}.trace.json"
    engine.save(path)
    save_tensors(inputs, {k: v.cpu() for k, v in kw.items()})
    cmd = [sys.executable, "-m", "xgbuild.cli.xgrun", str(path), "--device", args.device, "--inputs", str(inputs),
           "--warmup", str(args.warmup), "--iterations", str(args.iterations), "--profile", "--trace", str(trace),
           "--json", "--runtime", args.runtime]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    summary = json.loads(proc.stdout)
    (out / f"{args.model}.profile.json").write_text(json.dumps(summary, indent=1))
    name = torch.cuda.get_device_name(0) if not cpu else "CPU"
    print(f"{args.model} ({args.layers or 'all'} layers, {args.dtype}, batch {args.batch} x {args.seq}) on {name}, "
          f"{args.policy} winners; `xgrun --runtime {args.runtime} --warmup {args.warmup} --iterations {args.iterations} "
          "--profile`")
    print(render(summary["profile"], limit=30))
    print(f"trace: {trace}  summary: {out / f'{args.model}.profile.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
