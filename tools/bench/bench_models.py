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
        [--resume]
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
from bench_torch_models import DTYPES, count, local_target, rel_err  # noqa: E402  (the same target and error rules)

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


def _where(graph: Any, launch: dict) -> str:
    """The source of the first value a launch stores: `line N of module.path`."""
    outs = launch["binding"]["outputs"]
    src = graph.node(outs[0]).src if outs else None
    if not src:
        return ""
    return f"line {src[0]} of {src[2]}" if len(src) > 2 and src[2] else f"line {src[0]}"


def by_kernel(events: list[tuple[str, float]], launches: list[dict], iterations: int,
              where: Callable[[dict], str]) -> list[dict]:
    """XG kernels' GPU time per call, by kernel, slowest first: `events` are (kernel name, ms) of
    `iterations` calls in GPU order, `launches` the engine's kernel launches in order (the i-th
    event of each call is launch i: each kernel then says where its first launches store). When
    the events do not line up with the launches, they are grouped by name alone."""
    groups: dict[str, dict] = {}
    if launches and len(events) == iterations * len(launches):
        for i, launch in enumerate(launches):
            ms = sum(events[i + j * len(launches)][1] for j in range(iterations)) / iterations
            g = groups.setdefault(launch["kernel"].split(":")[0], {"launches": 0, "ms": 0.0, "where": []})
            g["launches"] += 1
            g["ms"] += ms
            if len(g["where"]) < 2:
                g["where"].append(where(launch))
    else:
        for name, ms in events:
            g = groups.setdefault(name, {"launches": 0.0, "ms": 0.0, "where": []})
            g["launches"] += 1 / iterations
            g["ms"] += ms / iterations
    return sorted(({"kernel": k, **g} for k, g in groups.items()), key=lambda r: -r["ms"])


def _profile(engine: Any, kw: dict, iterations: int, top: int = 12) -> dict:
    """XG's engine called as a user calls it (`engine(**kw)`: a replayed CUDA graph), `iterations`
    times under torch.profiler, which reads each kernel's GPU time from CUPTI: the time by kernel
    and by launch, the slowest `top` kernels kept and printed to stderr. (`xgrun --profile` brackets
    each launch with CUDA events while it launches kernel by kernel; where the host launches slower
    than the GPU runs, as for a model of many small kernels, those times include the GPU waiting for
    the next launch, and sum to several times the run.)"""
    engine(**kw)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            engine(**kw)
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    ours = [(e.name, e.device_time_total / 1000.0) for e in events if e.name.startswith("xg_")]
    other_ms = sum(e.device_time_total / 1000.0 for e in events if not e.name.startswith("xg_")) / iterations
    launches = [launch for launch in engine.engine.manifest["launches"] if launch["kernel"] != "extern"]
    graph = engine.engine.graph
    rows = by_kernel(ours, launches, iterations, lambda launch: _where(graph, launch))
    kernels_ms = sum(r["ms"] for r in rows)
    rows = rows[:top]
    total = kernels_ms + other_ms
    lines = [f"GPU time per call {total:.3f} ms: XG's kernels {kernels_ms:.3f} ms, other (copies, checks) "
             f"{other_ms:.3f} ms, over {iterations} calls",
             f"  {'kernel':28s} {'launches':>8s} {'ms':>8s} {'share':>6s}  where"]
    for r in rows:
        lines.append(f"  {r['kernel'][:28]:28s} {r['launches']:8.0f} {r['ms']:8.3f} {r['ms'] / total:6.1%}  "
                     f"{', '.join(w for w in r['where'] if w)}")
    print("\n".join(lines), file=sys.stderr, flush=True)
    return {"gpu_ms": total, "kernels_ms": kernels_ms, "other_ms": other_ms, "rows": rows}


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


# The arguments every row of one table shares (a resumed run must repeat them).
SETUP = ("batch", "seq", "images", "layers", "policy", "no_max_autotune")


def kept_rows(path: Path, device: str, args: argparse.Namespace) -> list[dict]:
    """The finished rows (no error) of an earlier run's JSON at `path`, for `--resume`: none if
    there is no file; a ValueError if it is unreadable, from another GPU or of other sizes or
    policy (rows measured two ways in one table would compare nothing)."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
        rows = data["rows"]
        if not isinstance(rows, list):
            raise TypeError("rows is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot resume from {path}: {exc}") from None
    if data.get("device") != device:
        raise ValueError(f"cannot resume from {path}: its rows were measured on {data.get('device')!r}, "
                         f"this GPU is {device!r}")
    before = data.get("args") or {}
    differ = [f"--{k.replace('_', '-')} {before.get(k)!r} (now {getattr(args, k)!r})" for k in SETUP
              if before.get(k) != getattr(args, k)]
    if differ:
        raise ValueError(f"cannot resume from {path}: its rows were measured with {', '.join(differ)}")
    return [r for r in rows if isinstance(r, dict) and "error" not in r and {"model", "dtype"} <= set(r)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--dtype", nargs="*", default=["bfloat16", "float32"], choices=sorted(DTYPES))
    ap.add_argument("--batch", type=count(1), default=8)
    ap.add_argument("--seq", type=count(1), default=512)
    ap.add_argument("--images", type=count(1), default=32)
    ap.add_argument("--layers", type=count(1), default=None, help="cut every model to this depth (quick runs)")
    ap.add_argument("--policy", default="measure", choices=["measure", "cache", "predict"])
    ap.add_argument("--no-max-autotune", action="store_true", help="leave torch.compile's max-autotune out")
    ap.add_argument("--profile", type=count(0), default=0, metavar="N",
                    help="also profile N calls of XG's engine with torch.profiler (GPU time by kernel, on stderr)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows --json already holds (same GPU) and measure only the missing ones: a "
                         "full table over several shorter runs")
    ap.add_argument("--json", default=str(REPO / "out" / "bench_models.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False       # XG's fp32 matmuls are IEEE; so are the peers'
    torch.backends.cudnn.allow_tf32 = False
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        rows = kept_rows(out, torch.cuda.get_device_name(0), args) if args.resume else []
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    done = {(r["model"], r["dtype"]) for r in rows}

    def write() -> None:           # after every row: a run cut short keeps the rows it finished
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                   "args": vars(args), "rows": rows}, indent=2))
    for name in args.models:
        for dt in args.dtype:
            if (name, dt) in done:
                continue
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
