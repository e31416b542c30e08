"""The models users run, at the sizes they run them, through `xg.compile` and the public API, beside
PyTorch eager and `torch.compile` (default and max-autotune) in one run: issue 21's benchmark.

Each model is built from its `transformers` config (random weights, no downloads) at full size
unless `--layers` cuts its depth: GPT2LMHeadModel (124M, 12 layers, 50257-token head), a
Llama-style model of about 1B parameters (hidden 2048, 16 layers, GQA 32/8), BertModel base,
ViTModel base/16 at 224x224, ResNetModel 50-layer at 224x224, and WhisperEncoder base. Text models
take batch x seq tokens with a padding mask (one row half padded), image models batch-of-images
(`--images`), Whisper 80 mel bins x 3000 frames. XG builds for the local GPU's profile with
`--policy` (measure by default: the tuner measures on this GPU), is checked against a float64
eager reference on the GPU, then timed as a user calls it: `engine(**inputs)` at its defaults
(checks on), and again with checks off. Timings are CUDA-event medians (`triton.testing.do_bench`).
Prints a table and writes JSON; rows where XG is slower than torch.compile's best mode are marked.

    python tools/bench/bench_models.py [--models gpt2 llama1b bert vit resnet50 whisper]
        [--dtype bfloat16 float32] [--batch 8] [--seq 512] [--images 32] [--layers N]
        [--policy measure|cache|predict] [--no-max-autotune] [--profile N] [--json out/bench_models.json]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import xg  # noqa: E402
from bench_torch_models import DTYPES, local_target, rel_err  # noqa: E402  (the same target and error rules)

MODELS = ("gpt2", "llama1b", "bert", "vit", "resnet50", "whisper")


def _text(vocab: int, token_types: bool = False, device: str = "cuda") -> Callable[[argparse.Namespace], dict]:
    def inputs(args: argparse.Namespace) -> dict:
        ids = torch.randint(0, vocab, (args.batch, args.seq), device=device)
        mask = torch.ones(args.batch, args.seq, dtype=torch.long, device=device)
        mask[0, args.seq // 2:] = 0
        kw = {"input_ids": ids, "attention_mask": mask}
        if token_types:
            kw["token_type_ids"] = torch.zeros_like(ids)
        return kw
    return inputs


def build(name: str, layers: int | None, device: str = "cuda") -> tuple[torch.nn.Module,
                                                                       Callable[[argparse.Namespace], dict]]:
    """The model (eval mode, no KV cache) and a function of the run's arguments giving its inputs
    (on `device`)."""
    import transformers as T

    def depth(n: int) -> int:
        return layers or n
    if name == "gpt2":
        cfg = T.GPT2Config(n_layer=depth(12), n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        model, inputs = T.GPT2LMHeadModel(cfg), _text(50257, device=device)
    elif name == "llama1b":
        cfg = T.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=depth(16),
                            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048)
        model, inputs = T.LlamaModel(cfg), _text(32000, device=device)
    elif name == "bert":
        cfg = T.BertConfig(num_hidden_layers=depth(12))
        model, inputs = T.BertModel(cfg, add_pooling_layer=False), _text(cfg.vocab_size, token_types=True,
                                                                        device=device)
    elif name == "vit":
        cfg = T.ViTConfig(num_hidden_layers=depth(12), image_size=224, patch_size=16)
        model = T.ViTModel(cfg, add_pooling_layer=False)

        def inputs(args: argparse.Namespace) -> dict:
            return {"pixel_values": torch.randn(args.images, 3, 224, 224, device=device)}
    elif name == "resnet50":
        cfg = T.ResNetConfig(depths=[3, 4, 6, 3] if layers is None else [1] * 4, layer_type="bottleneck",
                             hidden_sizes=[256, 512, 1024, 2048], embedding_size=64)
        model = T.ResNetModel(cfg)

        def inputs(args: argparse.Namespace) -> dict:
            return {"pixel_values": torch.randn(args.images, 3, 224, 224, device=device)}
    elif name == "whisper":
        cfg = T.WhisperConfig(d_model=512, encoder_layers=depth(6), encoder_attention_heads=8, encoder_ffn_dim=2048,
                              decoder_layers=1, decoder_attention_heads=8, decoder_ffn_dim=2048,   # whisper-base
                              num_mel_bins=80, max_source_positions=1500)
        model = T.WhisperModel(cfg).get_encoder()

        def inputs(args: argparse.Namespace) -> dict:
            return {"input_features": torch.randn(args.batch, 80, 3000, device=device)}
    else:
        raise SystemExit(f"unknown model {name} ({', '.join(MODELS)})")
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model.eval(), inputs


def output(result: Any) -> torch.Tensor:
    for key in ("logits", "last_hidden_state"):
        v = getattr(result, key, None)
        if v is not None:
            return v
    return result[0] if isinstance(result, (tuple, list)) else result


def _cast(kw: dict, dtype: torch.dtype) -> dict:
    """Float inputs (pixels, features) in the model's dtype; ids and masks as they are."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in kw.items()}


def _phase(name: str, dtype: str, what: str) -> None:
    """Where the run is, on stderr as it happens: a long build shows which model it is in."""
    print(f"[{time.strftime('%H:%M:%S')}] {name} {dtype}: {what}", file=sys.stderr, flush=True)


def _profile(engine: Any, kw: dict, iterations: int, top: int = 12) -> dict:
    """XG's engine run `iterations` times kernel by kernel under the profiler (what `xgrun
    --profile` prints): where its time goes, printed to stderr; the slowest `top` kernels kept."""
    from xgbuild.runtime.profile import Profiler, render
    inputs = engine.bind((), kw)
    profiler = Profiler("cuda")
    for _ in range(iterations):
        engine.engine.run(inputs, device="cuda", check=engine.check, profiler=profiler)
    summary = profiler.summary()
    print(render(summary, limit=top), file=sys.stderr, flush=True)
    return {"kernels_ms": summary["kernels_ms"], "run_p50_ms": summary["run_ms"]["p50"],
            "launches": summary["launches"], "rows": summary["rows"][:top]}


def run(args: argparse.Namespace, name: str, dtype_name: str) -> dict:
    from triton.testing import do_bench
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    model, make_inputs = build(name, args.layers)
    model = model.to(dtype).cuda()
    kw = _cast(make_inputs(args), dtype)
    params = sum(p.numel() for p in model.parameters())
    _phase(name, dtype_name, f"building ({params / 1e6:.1f}M parameters, tune={args.policy})")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(model, example_kwargs=kw, target=local_target(), tune=args.policy)
    build_s = time.perf_counter() - t0
    _phase(name, dtype_name, f"built in {build_s:.1f} s")
    row: dict[str, Any] = {"model": name, "dtype": dtype_name, "params": params, "build_s": build_s}
    with torch.no_grad():
        ref = output(copy.deepcopy(model).double()(**_cast(kw, torch.float64)))
        row["rel_err"] = rel_err(output(engine(**kw)), ref)
        row["eager_rel_err"] = rel_err(output(model(**kw)), ref)
        del ref
        row["xg_ms"] = do_bench(lambda: engine(**kw), return_mode="median")
        engine.check = False
        row["xg_nocheck_ms"] = do_bench(lambda: engine(**kw), return_mode="median")
        engine.check = True
        if args.profile:
            row["profile"] = _profile(engine, kw, args.profile)
        row["eager_ms"] = do_bench(lambda: model(**kw), return_mode="median")
        modes = ["default"] + ([] if args.no_max_autotune else ["max-autotune-no-cudagraphs"])
        _phase(name, dtype_name, f"XG {row['xg_ms']:.3f} ms, eager {row['eager_ms']:.3f} ms; torch.compile next")
        for mode in modes:
            torch._dynamo.reset()
            compiled = torch.compile(model, mode=None if mode == "default" else mode)
            t0 = time.perf_counter()
            compiled(**kw)
            row[f"compile_{mode}_first_s"] = time.perf_counter() - t0
            row[f"compile_{mode}_ms"] = do_bench(lambda: compiled(**kw), return_mode="median")
    best = min(row[f"compile_{m}_ms"] for m in modes)
    row.update(compile_best_ms=best, xg_over_compile=row["xg_ms"] / best,
               kernels=len(engine.engine.manifest["kernels"]), launches=len(engine.engine.manifest["launches"]))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--dtype", nargs="*", default=["bfloat16", "float32"], choices=sorted(DTYPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--layers", type=int, default=None, help="cut every model to this depth (quick runs)")
    ap.add_argument("--policy", default="measure", choices=["measure", "cache", "predict"])
    ap.add_argument("--no-max-autotune", action="store_true", help="leave torch.compile's max-autotune out")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also run XG's engine N times kernel by kernel (xgrun --profile's table, on stderr)")
    ap.add_argument("--json", default=str(REPO / "out" / "bench_models.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False       # XG's fp32 matmuls are IEEE; so are the peers'
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:           # after every row: a run cut short keeps the rows it finished
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                   "args": vars(args), "rows": rows}, indent=2))
    for name in args.models:
        for dt in args.dtype:
            try:
                row = run(args, name, dt)
            except Exception as exc:  # noqa: BLE001 (one model's failure is a row, not the end of the run)
                row = {"model": name, "dtype": dt, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            write()
            gc.collect()
            torch.cuda.empty_cache()
    print(f"\nbatch {args.batch} x {args.seq} tokens, {args.images} images; layers {args.layers or 'full'}; "
          f"tune={args.policy}; {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| model | dtype | XG ms (checks on) | checks off | eager | compile | max-autotune | XG / best "
          "| rel err (eager's) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['dtype']} | {r['error']} | | | | | | |")
            continue
        mat = r.get("compile_max-autotune-no-cudagraphs_ms")
        slow = " (slower)" if r["xg_over_compile"] > 1 else ""
        print(f"| {r['model']} | {r['dtype']} | {r['xg_ms']:.3f} | {r['xg_nocheck_ms']:.3f} | {r['eager_ms']:.3f} | "
              f"{r['compile_default_ms']:.3f} | {'-' if mat is None else f'{mat:.3f}'} | "
              f"{r['xg_over_compile']:.2f}x{slow} | {r['rel_err']:.1e} ({r['eager_rel_err']:.1e}) |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
