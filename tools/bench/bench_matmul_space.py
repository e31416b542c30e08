"""Times explicit matmul template configs (tiles, TMA, persistent, 3xTF32) on the local GPU, beside
torch, for the benchmark's GEMM shapes (docs/codegen.md): where the tuner's search space should look.

Each problem is an XG program; its matmul jobs are planned as `xgc` plans them, every config is
emitted as the tuned variant of the job, compiled for this GPU, checked against the float64
reference (relative error printed; the tuner's gate verdict beside it) and timed with
`measure.time_gpu` (L2 flushed before each run, median). Writes JSON.

    python tools/bench/bench_matmul_space.py [--only NAME ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from xgbuild.compiler.codegen.templates import emit  # noqa: E402
from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.hw import load_profile  # noqa: E402
from xgbuild.tuner.cuda_measure import CudaMeasurer  # noqa: E402
from xgbuild.tuner.jobs import plan  # noqa: E402
from xgbuild.tuner.measure import time_gpu  # noqa: E402
from xgbuild.compiler.codegen.templates.base import config_key, make_config  # noqa: E402
from xgbuild.tuner.tuner import Compiler, JobData, agrees  # noqa: E402

GEMM = "extern Tensor[{dt}, M, K] A\nextern Tensor[{dt}, K, N] B\ndef main() {{\n    return A @ B\n}}\n"
# B stored [N, K], as an `nn.Linear` weight (and a tied LM head's embedding) is
LINEAR = ("extern Tensor[{dt}, M, K] A\nextern Tensor[{dt}, N, K] W\ndef main() {{\n"
          "    return A @ transpose(W, 0, 1)\n}}\n")
MLP = """extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, D, F] W1
extern Tensor[bfloat16, F] B1
extern Tensor[bfloat16, F, D] W2
def main() {
    return gelu(X @ W1 + B1) @ W2
}
"""


def cfg(bm, bn, bk, w, s, tma=0, programs=0, x3=0, g=8):
    return make_config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, num_warps=w, num_stages=s, TMA=tma,
                       PROGRAMS=programs, TF32X3=x3)


def half_configs(sms: int) -> list[dict]:
    tiles = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
             (128, 128, 64, 4, 4), (64, 256, 64, 4, 4)]
    # Other k-depths and stage counts of the large tiles, plain template only.
    more = [(128, 256, 32, 8, 4), (128, 256, 32, 8, 5), (128, 256, 128, 8, 2), (128, 128, 128, 8, 3),
            (128, 128, 128, 4, 3), (256, 128, 64, 8, 4), (256, 128, 32, 8, 5), (128, 128, 32, 4, 5),
            (128, 256, 64, 8, 3, 0, 0, 0, 16), (128, 256, 64, 8, 3, 0, 0, 0, 4)]
    return [cfg(*t, tma=tma, programs=p) for t in tiles for tma in (0, 1) for p in (0, sms)] + [cfg(*t) for t in more]


def fp32_configs(sms: int) -> list[dict]:
    ieee = [(128, 128, 32, 8, 3), (128, 128, 16, 8, 3), (128, 128, 16, 8, 2), (64, 128, 32, 4, 3),
            (128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (128, 128, 32, 4, 2), (256, 128, 16, 8, 2)]
    x3 = [(128, 128, 32, 8, 3), (128, 256, 32, 8, 3), (128, 128, 64, 8, 3), (128, 128, 32, 4, 4),
          (64, 128, 32, 4, 4), (128, 64, 32, 4, 4)]
    return [cfg(*t) for t in ieee] + [cfg(*t, tma=tma, x3=1, programs=p) for t in x3 for tma in (0, 1)
                                      for p in (0, sms)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", default="bench_matmul_space.json")
    ap.add_argument("--tiles", default=None,
                    help='configs to time instead of the built-in lists: "BM,BN,BK,warps,stages[,TMA,PROGRAMS,TF32X3,GROUP_M];..."')
    args = ap.parse_args()
    name = torch.cuda.get_device_name(0)
    target = next(t for t in ("H200", "H100", "B200", "A100") if t in name)
    profile = load_profile(target)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    arch = 10 * torch.cuda.get_device_capability(0)[0] + torch.cuda.get_device_capability(0)[1]
    problems = [("gemm bf16 4096^3", GEMM.format(dt="bfloat16"), {"M": 4096, "K": 4096, "N": 4096}, half_configs),
                ("mlp bf16 8192x4096x11008", MLP, {"T": 8192, "D": 4096, "F": 11008}, half_configs),
                ("gemm fp32 4096^3", GEMM.format(dt="float32"), {"M": 4096, "K": 4096, "N": 4096}, fp32_configs),
                ("linear bf16 4096x3072x2048", LINEAR.format(dt="bfloat16"), {"M": 4096, "K": 2048, "N": 3072},
                 half_configs),
                ("gpt2 c_fc bf16 4096x3072x768", GEMM.format(dt="bfloat16"), {"M": 4096, "K": 768, "N": 3072},
                 half_configs),
                ("lm head bf16 4096x50257x768", LINEAR.format(dt="bfloat16"), {"M": 4096, "K": 768, "N": 50257},
                 half_configs)]
    compiler = Compiler(arch, None, 16)
    measurer = CudaMeasurer(0, profile)
    rows = []
    for pname, src, dims, configs in problems:
        if args.only and not any(o in pname for o in args.only):
            continue
        jobs, _ = plan(compile_source(src, "space.xg").optimized.main, dims)
        for job in jobs:
            if job.spec.kind != "matmul":
                continue
            data = JobData(job)
            ref = data.reference("cuda")
            out_dt = [job.spec.nodes[k].dtype for k in job.spec.outputs]
            p = job.problem
            cands = configs(sms) if not args.tiles else [cfg(*(int(x) for x in t.split(","))) for t in args.tiles.split(";")]
            if args.tiles and job.spec.operands[job.spec.matmul[0]][0] == "float32":
                cands = [c for c in cands if c["BLOCK_K"] <= 64]
            futs = []
            for c in cands:
                v = job.fast_variant(c)
                em = emit(job.spec, c, v)
                futs.append((c, v, em, compiler.submit(em, c["num_warps"], c["num_stages"])))
            for c, v, em, fut in futs:
                row = {"problem": pname, "job": job.ident, "config": config_key(c), "tma_emitted":
                       "make_tensor_descriptor" in em.source}
                try:
                    kb, _ = fut.result()
                    ms, outs = measurer.measure(job, v, c, em, kb, data)
                    errs = [((o.double() - r.double()).norm() / r.double().norm()).item() for o, r in zip(outs, ref)]
                    verdict = next((x for x in (agrees(o, r, d) for o, r, d in zip(outs, ref, out_dt)) if x), "ok")
                    row.update(ms=ms, tflops=p.flops / ms / 1e9, rel_err=max(errs), gate=verdict,
                               shared=kb.shared)
                except Exception as exc:  # noqa: BLE001 (a failing config is a row of the table)
                    row.update(ms=float("inf"), error=str(exc).splitlines()[0][:160] if str(exc) else repr(exc))
                rows.append(row)
                print(json.dumps(row), flush=True)
            # torch beside it: the same kernel's work through cuBLAS (+ eager epilogue)
            vals = data.value_fn("cuda")
            binding, nodes = job.sites[0]
            a, b = (vals(i) for i in job.graph.node(nodes[0]).inputs)
            tms = time_gpu(lambda _i: torch.matmul(a, b), l2_bytes=profile.l2_bytes).median_ms
            r32 = None
            if a.dtype == torch.float32:
                r32 = ((torch.matmul(a, b).double() - ref[0].cuda()).norm() / ref[0].cuda().norm()).item()
            row = {"problem": pname, "job": job.ident, "config": "torch.matmul", "ms": tms,
                   "tflops": 2.0 * p.batch * p.m * p.n * p.k / tms / 1e9, "rel_err": r32}
            rows.append(row)
            print(json.dumps(row), flush=True)
    compiler.close()
    print(f"\n{name}")
    print("| job | config | ms | TFLOP/s | rel err | gate |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (r["job"], r["ms"])):
        err = r.get("rel_err")
        print(f"| {r['job'][:40]} | {r['config']} | {r['ms']:.4f} | {r.get('tflops', 0):.0f} | "
              f"{'' if err is None else f'{err:.2e}'} | {r.get('gate', r.get('error', ''))} |")
    Path(args.json).write_text(json.dumps({"gpu": name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
