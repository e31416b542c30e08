"""transformers' models through `xg.compile` (no fallback), beside PyTorch eager and `torch.compile`,
on one GPU: the workloads of the model-speed issue (issue 21), now that they compile whole.

Each model is built from its config (random weights), called by keyword with `input_ids` and a
padding `attention_mask`, compiled for the local GPU's profile (`--policy predict` by default: the
roofline model's picks, no measuring), checked against a float64 eager reference on the GPU, then
timed with `triton.testing.do_bench` (CUDA events, median) as a user calls it: `engine(**inputs)` at
its defaults (input checks on), the same with checks off, eager, and `torch.compile` (default mode).
Prints a table and writes JSON.

    python tools/bench/bench_hf_models.py [--models gpt2 llama] [--dtype bfloat16 float32]
        [--batch 8] [--seq 512] [--layers 4] [--policy predict] [--json out/bench_hf_models.json]
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

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import xg  # noqa: E402
from bench_torch_models import DTYPES, local_target, rel_err  # noqa: E402  (the same target and error rules)


def build(name: str, layers: int) -> torch.nn.Module:
    import transformers as T
    if name == "gpt2":          # GPT-2 small's width and its 50257-token LM head
        cfg = T.GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        model = T.GPT2LMHeadModel(cfg)
    elif name == "llama":       # 768 wide, grouped-query attention 12/4
        cfg = T.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                            num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024)
        model = T.LlamaModel(cfg)
    else:
        raise SystemExit(f"unknown model {name} (gpt2, llama)")
    model.config.use_cache = False
    return model.eval()


def output(result) -> torch.Tensor:
    for key in ("logits", "last_hidden_state"):
        v = getattr(result, key, None)
        if v is not None:
            return v
    return result[0] if isinstance(result, (tuple, list)) else result


def run(args, name: str, dtype_name: str) -> dict:
    from triton.testing import do_bench
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    model = build(name, args.layers).to(dtype).cuda()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")
    mask = torch.ones(args.batch, args.seq, dtype=torch.long, device="cuda")
    mask[0, args.seq // 2:] = 0
    kw = {"input_ids": ids, "attention_mask": mask}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(model, example_kwargs=kw, target=local_target(), tune=args.policy)
    build_s = time.perf_counter() - t0
    with torch.no_grad():
        ref = output(copy.deepcopy(model).double()(**kw))
        err = rel_err(output(engine(**kw)), ref)
        eager_err = rel_err(output(model(**kw)), ref)
        del ref
        xg_ms = do_bench(lambda: engine(**kw), return_mode="median")
        engine.check = False
        xg_nocheck_ms = do_bench(lambda: engine(**kw), return_mode="median")
        eager_ms = do_bench(lambda: model(**kw), return_mode="median")
        compiled = torch.compile(model)
        compiled(**kw)
        compile_ms = do_bench(lambda: compiled(**kw), return_mode="median")
    inner = engine.engine
    return {"model": name, "dtype": dtype_name, "batch": args.batch, "seq": args.seq, "layers": args.layers,
            "xg_ms": xg_ms, "xg_nocheck_ms": xg_nocheck_ms, "eager_ms": eager_ms, "compile_ms": compile_ms,
            "xg_over_compile": xg_ms / compile_ms, "xg_over_eager": xg_ms / eager_ms, "rel_err": err,
            "eager_rel_err": eager_err, "build_s": build_s, "kernels": len(inner.manifest["kernels"]),
            "launches": len(inner.manifest["launches"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["gpt2", "llama"])
    ap.add_argument("--dtype", nargs="*", default=["bfloat16"], choices=sorted(DTYPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--policy", default="predict", choices=["measure", "cache", "predict"])
    ap.add_argument("--json", default=str(REPO / "out" / "bench_hf_models.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False       # XG's fp32 matmuls are IEEE; so are the peers'
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name in args.models:
        for dt in args.dtype:
            row = run(args, name, dt)
            rows.append(row)
            print(f"{name} {dt}: xg {row['xg_ms']:.3f} ms (checks off {row['xg_nocheck_ms']:.3f}) eager "
                  f"{row['eager_ms']:.3f} compile {row['compile_ms']:.3f}; err {row['rel_err']:.2e} (eager "
                  f"{row['eager_rel_err']:.2e}); build {row['build_s']:.1f} s, {row['kernels']} kernels, "
                  f"{row['launches']} launches", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    print(f"\nbatch {args.batch} x {args.seq} tokens, {args.layers} layers, tune={args.policy}; "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| model | dtype | XG engine(**kw) ms | XG checks off ms | eager ms | torch.compile ms | XG / compile "
          "| rel err (eager) | launches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['dtype']} | {r['xg_ms']:.3f} | {r['xg_nocheck_ms']:.3f} | {r['eager_ms']:.3f} | "
              f"{r['compile_ms']:.3f} | {r['xg_over_compile']:.2f}x | {r['rel_err']:.1e} ({r['eager_rel_err']:.1e}) "
              f"| {r['launches']} |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
