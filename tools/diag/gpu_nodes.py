"""GPU diagnosis: per-kernel-output error of an imported model's CUDA run against the float64 CPU
reference (which node first drifts), and a per-kernel time profile of the GPT bench stack."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))


def target() -> str:
    name = torch.cuda.get_device_name(0)
    for t in ("H200", "H100", "B200", "A100"):
        if t in name:
            return t
    return "H100"


def node_errors(name: str, batch: int = 2) -> None:
    import xg
    from torch_models import make
    from xgbuild.compiler.passes.specialize import bind_symbols, specialize
    from xgbuild.runtime import values
    from xgbuild.runtime.cpu import CpuExecutor

    model, inputs, dyn = make(name)
    eng = xg.compile(model, inputs, target=target(), tune="predict", dynamic_shapes=dyn)
    ins = make(name, batch=batch, seed=11)[1]
    cuda_in = tuple(x.cuda() for x in ins)
    got = eng(*cuda_in)
    got = got if isinstance(got, tuple) else (got,)
    again = eng(*cuda_in)
    again = again if isinstance(again, tuple) else (again,)
    print(f"[{name}] call 2 vs call 1:", [((a.double() - b.double()).norm() / b.double().norm()).item()
                                         for a, b in zip(again, got)], flush=True)
    with torch.no_grad():
        refg = copy.deepcopy(model).double().cuda()(*[x.double() if x.is_floating_point() else x for x in cuda_in])
        refc = copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x for x in ins])
        eag = model.cuda()(*cuda_in)
    refg = refg if isinstance(refg, tuple) else (refg,)
    refc = refc if isinstance(refc, tuple) else (refc,)
    eag = eag if isinstance(eag, tuple) else (eag,)
    for g, rg, rc, e in zip(got, refg, refc, eag):
        err = lambda a, b: ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()
        print(f"[{name}] out {tuple(g.shape)}: xg-vs-ref_gpu {err(g, rg):.2e} xg-vs-ref_cpu {err(g, rc):.2e} "
              f"ref_gpu-vs-ref_cpu {err(rg, rc):.2e} eager_fp32 {err(e, rc):.2e}", flush=True)

    inner = eng.engine
    # the engine's own input preparation (weights included), as ModelEngine does
    feed = {}
    sig_names = [s["name"] for s in eng.signature]
    for n, t in zip(sig_names, cuda_in):
        feed[n] = t
    prepared = inner.prepare_inputs(feed, "cuda")
    sg = specialize(inner.graph, bind_symbols(inner.graph, {k: tuple(v.shape) for k, v in prepared.items()}))
    seen: dict[int, torch.Tensor] = {}
    orig = values.Values.__setitem__

    def rec(self, nid, value):
        seen[nid] = value
        orig(self, nid, value)
    values.Values.__setitem__ = rec
    ex = inner.cuda_executor(check=False)
    ex.kernels.replay = False
    ex.kernels.run(sg, prepared)
    torch.cuda.synchronize()
    values.Values.__setitem__ = orig
    cpu_in = {k: v.cpu() for k, v in prepared.items()}
    c64 = CpuExecutor(float64=True, check=False, timings=False)
    c32 = CpuExecutor(float64=False, check=False, timings=False)
    v64: dict[int, torch.Tensor] = {}
    v32: dict[int, torch.Tensor] = {}
    for n in sg.nodes:
        v64[n.id] = c64.eval(n, [v64[i] for i in n.inputs], cpu_in).to(c64.dtype(n.dtype))
        v32[n.id] = c32.eval(n, [v32[i] for i in n.inputs], cpu_in).to(c32.dtype(n.dtype))
    rows = []
    for nid, t in seen.items():
        n = sg.node(nid)
        if not t.dtype.is_floating_point:
            continue
        r = v64[nid].double()
        den = r.norm().item() or 1e-30
        e_gpu = ((t.double().cpu() - r).norm() / den).item()
        e_cpu = ((v32[nid].double() - r).norm() / den).item()
        rows.append((nid, n.op.value, tuple(n.shape), e_gpu, e_cpu))
    rows.sort()
    print(f"[{name}] {len(rows)} kernel outputs: id op shape gpu_err cpu32_err")
    for r in rows:
        flag = " <==" if r[3] > 10 * max(r[4], 1e-7) else ""
        print(f"  %{r[0]} {r[1]} {r[2]} {r[3]:.2e} {r[4]:.2e}{flag}")


def profile_gpt(dtype: torch.dtype, tune: str = "predict") -> None:
    """Per-kernel CUDA times of the GPT bench stack; with tune="measure", also every attention and
    matmul candidate's measured time (which configs the cost model should have picked)."""
    import xg
    from torch_models import GPT
    from xgbuild.tuner import cuda_measure
    torch.manual_seed(0)
    model = GPT(vocab=8192, ctx=512, d=768, heads=12, layers=4).eval().to(dtype)
    idx = torch.randint(0, 8192, (8, 512))
    orig_measure = cuda_measure.CudaMeasurer.measure

    def logged(self, job, variant, config, *rest):
        ms, outs = orig_measure(self, job, variant, config, *rest)
        if job.problem.kind in ("attention", "matmul"):
            print(f"[measure] {job.problem.kind} {job.problem} {variant.name if hasattr(variant, 'name') else variant}"
                  f" {config} {ms:.4f} ms", flush=True)
        return ms, outs
    cuda_measure.CudaMeasurer.measure = logged
    eng = xg.compile(model, (idx,), target=target(), tune=tune,
                     dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    idx = idx.cuda()
    eng.check = False
    for _ in range(3):
        eng(idx)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            eng(idx)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60))
    kinds = {k["name"]: k for k in eng.engine.manifest["kernels"]}
    for name, k in list(kinds.items())[:80]:
        print(name, k.get("kind"), k.get("problem", k.get("shape")), [v.get("config") for v in k["variants"]][:1])


def attention_space(out: str) -> None:
    """Every attention candidate's measured time (fp32 and bf16, causal or not, the GPT bench's
    head shapes) next to the cost model's prediction: what `--tune predict` should pick."""
    import json
    import os
    import torch.nn.functional as F
    import xg
    from xgbuild.hw import load_profile
    from xgbuild.tuner import cuda_measure
    from xgbuild.tuner.predict import predict_ms
    rows = []
    profile = load_profile(target())
    orig_measure = cuda_measure.CudaMeasurer.measure

    def logged(self, job, variant, config, *rest):
        ms, outs = orig_measure(self, job, variant, config, *rest)
        p = job.problem
        if p.kind == "attention":
            rows.append({"dtype": p.dtype, "causal": p.causal, "config": config, "ms": ms,
                         "predicted": predict_ms(p, config, profile)})
        return ms, outs
    cuda_measure.CudaMeasurer.measure = logged

    class Attn(torch.nn.Module):
        def __init__(self, causal):
            super().__init__()
            self.causal = causal

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (True, False):
            q, k, v = (torch.randn(8, 12, 512, 64, dtype=dtype) for _ in range(3))
            xg.compile(Attn(causal), (q, k, v), target=target(), tune="measure")
    for r in sorted(rows, key=lambda r: (r["dtype"], r["causal"], r["ms"])):
        c = r["config"]
        print(f"{r['dtype']} causal={int(r['causal'])} M{c['BLOCK_M']} N{c['BLOCK_N']} w{c['num_warps']} "
              f"s{c['num_stages']}: {r['ms']:.4f} ms (predicted {r['predicted']:.4f})")
    with open(os.path.join(out, "attention_space.json"), "w") as f:
        json.dump(rows, f, indent=1)


def vit_fastpath() -> None:
    """Is the CUDA float64 ViT reference off because of the MHA fast path?"""
    from torch_models import make
    model, _, _ = make("vit")
    x = make("vit", batch=2, seed=11)[1][0]
    with torch.no_grad():
        cpu = copy.deepcopy(model).double()(x.double())
        fast = copy.deepcopy(model).double().cuda()(x.double().cuda()).cpu()
        torch.backends.mha.set_fastpath_enabled(False)
        slow = copy.deepcopy(model).double().cuda()(x.double().cuda()).cpu()
        torch.backends.mha.set_fastpath_enabled(True)
    err = lambda a, b: ((a - b).norm() / b.norm()).item()
    print(f"[vit-fastpath] cuda fast vs cpu {err(fast, cpu):.2e}; cuda unfused vs cpu {err(slow, cpu):.2e}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1:] or ["vit", "gpt-bf16"]
    for w in what:
        if w == "attention-space":
            import os
            attention_space(os.environ.get("OUT", "."))
        elif w == "vit-fastpath":
            vit_fastpath()
        elif w.startswith("gpt-"):       # gpt-bf16, gpt-fp32, gpt-fp32-measure
            profile_gpt(torch.bfloat16 if w.startswith("gpt-bf16") else torch.float32,
                        "measure" if w.endswith("-measure") else "predict")
        else:
            node_errors(w)
