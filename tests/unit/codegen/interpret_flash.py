"""Attention's flash-style gradient kernels (templates/flash.py) under Triton's interpreter: a
causal attention with a fill far below the scores and one near them, unmasked, in float32 and with bfloat16
products, each run at several score-block shapes (square, taller, wider, so the causal loops'
bounds move; the forward kernel, which writes the log-sum-exp, once over v's columns in blocks
of 16) and compared with the float64 CPU reference; a fused qkv projection's gradient, which the
dk/dv kernel writes into its three slots. Prints, as JSON, per program and
config, the largest relative error of the gradients. A script, not a test: TRITON_INTERPRET must
be set before Triton is imported, so the test runs it in a fresh process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from xgbuild.runtime import interpret

BODY = """extern Tensor[{dt}, 2, 3, T, D] Q
extern Tensor[{dt}, 2, 3, S, D] K
extern Tensor[{dt}, 2, 3, S, E] V
extern Tensor[float32, 2, 3, T, E] G
def f(Tensor[{dt}, 2, 3, T, D] q, Tensor[{dt}, 2, 3, S, D] k, Tensor[{dt}, 2, 3, S, E] v,
      Tensor[float32, 2, 3, T, E] g) -> float32 {{
    keep = reshape(arange(T), [T, 1]) >= reshape(arange(S), [1, S])
    x = cast(q @ transpose(k), float32) * {scale}
    p = softmax({scores}, dim=3)
    return {ret}
}}
def main() {{
    return grad(f, wrt={wrt})(Q, K, V, G)
}}
"""
PROGRAMS = {
    "causal_f32": dict(dt="float32", scale="0.125", scores="where(keep, x, -1e9)"),
    # A fill near the scores: the masked keys' weights exp(fill - lse) are not 0, so the kernels'
    # closed forms for the keys and query rows they skip are exercised.
    "causal_near_f32": dict(dt="float32", scale="0.125", scores="where(keep, x, -2.0)"),
    "plain_f32": dict(dt="float32", scale="0.3", scores="x"),
    "causal_bf16": dict(dt="bfloat16", scale="0.125", scores="where(keep, x, -1e9)"),
}
# Above, dO's own ops share the delta's row kernel, which stays. Below, dO is a product's: dq's kernel
# computes the delta, writing it when dk and dv read it; with no dq the delta is a row kernel of its own.
PARTIAL = {
    # (dO a product's, so the delta's row kernel is its ops alone and joins dq's)
    "q_only_bf16": dict(dt="bfloat16", scale="0.125", scores="where(keep, x, -1e9)", wrt="(q,)",
                        ret="sum(cast((cast(p, bfloat16) @ v) @ transpose(v), float32))"),
    # all three, dO a product's: dq's kernel writes the delta that dk and dv read
    "qkv_product_f32": dict(dt="float32", scale="0.125", scores="where(keep, x, -2.0)", wrt="(q, k, v)",
                            ret="sum((cast(p, float32) @ v) @ transpose(v))"),
    "kv_only_f32": dict(dt="float32", scale="0.125", scores="where(keep, x, -2.0)", wrt="(k, v)"),
    # Sharp bfloat16 scores (standard deviation about 40, D = 24): bfloat16's spacing there is 0.25,
    # so scores rounded to the product's dtype would move the probabilities by up to 12%. The
    # kernels keep them float32, as the forward does (triton_attention.py).
    "sharp_bf16": dict(dt="bfloat16", scale="8.0", scores="where(keep, x, -1e9)", wrt="(q, k, v)"),
}
# A fused qkv projection's gradient, as models/train.xg's: the heads' gradients placed into one
# [B, T, 3, H, DH] tensor, which dk and dv's kernel writes (dq copied in: schedule.py
# `placed_grads`); T = 40 leaves every block shape a partial last block.
PLACED = """B = 2
T = 40
H = 3
DH = 8
N = B * T
D = H * DH
D3 = 3 * D
extern Tensor[{dt}, N, D3] X
extern Tensor[float32, B, H, T, DH] G
def heads(Tensor[{dt}, N, D] x) -> Tensor[{dt}, B, H, T, DH] {{
    return transpose(reshape(x, [B, T, H, DH]), dim0=1, dim1=2)
}}
def f(Tensor[{dt}, N, D3] qkv, Tensor[float32, B, H, T, DH] g) -> float32 {{
    q = heads(qkv[:, 0:D])
    k = heads(qkv[:, D:2 * D])
    v = heads(qkv[:, 2 * D:D3])
    causal = reshape(arange(T), [T, 1]) >= reshape(arange(T), [1, T])
    s = cast(q @ transpose(k), float32) * 0.35
    p = softmax(where(causal, s, -1e9), dim=3)
    return sum(cast(cast(p, {dt}) @ v, float32) * g)
}}
def main() {{
    return grad(f, wrt=(qkv,))(X, G)
}}
"""
# The attention output's heads merged for the output projection, as models/train.xg's under its
# precision policy (a float32 value cast back for the product), and read again by the backward
# pass's delta: merge-heads has the delta read it back from the merged value, and the attention
# kernel writes only that.
MERGED = PLACED.replace("extern Tensor[float32, B, H, T, DH] G", """extern Tensor[{dt}, D, D] WO
extern Tensor[float32, N, D] G""").replace(
    "def f(Tensor[{dt}, N, D3] qkv, Tensor[float32, B, H, T, DH] g) -> float32 {{",
    "def f(Tensor[{dt}, N, D3] qkv, Tensor[{dt}, D, D] wo, Tensor[float32, N, D] g) -> float32 {{").replace(
    "    return sum(cast(cast(p, {dt}) @ v, float32) * g)", """    o = cast(cast(p, {dt}) @ v, float32)
    y = reshape(transpose(o, dim0=1, dim1=2), [N, D])
    return sum(cast(cast(y, {dt}) @ wo, float32) * g)""").replace(
    "return grad(f, wrt=(qkv,))(X, G)", "return grad(f, wrt=(qkv, wo))(X, WO, G)")
CONFIGS = [(32, 32), (64, 32), (32, 64)]
DIMS = [{"T": 70, "S": 70, "D": 24, "E": 40}, {"T": 45, "S": 29, "D": 16, "E": 16}]


def main() -> None:
    interpret.enable()
    from xgbuild.build.interpreted import check_graph
    from xgbuild.compiler.driver import compile_file
    from xgbuild.runtime.tensor_io import random_inputs
    from xgbuild.build.package import engine_of

    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        ret = "sum(cast(cast(p, {dt}) @ v, float32) * g)"
        runs = [(name, {"wrt": "(q, k, v)", "ret": ret.format(**fmt), **fmt}, DIMS, CONFIGS)
                for name, fmt in PROGRAMS.items()]
        runs += [(name, {"ret": ret.format(**fmt), **fmt}, DIMS[:1], CONFIGS[1:2]) for name, fmt in PARTIAL.items()]
        runs += [(f"{form}_{short}", {"dt": dt, "body": body}, [{"T": 40, "S": 40}], CONFIGS)
                 for form, body in (("placed", PLACED), ("merged", MERGED))
                 for short, dt in (("bf16", "bfloat16"), ("f32", "float32"))]
        for name, fmt, dims_list, configs in runs:
            path = Path(tmp) / f"{name}.xg"
            path.write_text(fmt.get("body", BODY).format(**fmt))
            compiled = compile_file(str(path))
            graph = compiled.optimized.main
            flash = sum(n.op.value == "attn_grad" for n in graph.nodes)
            from xgbuild.compiler.codegen.schedule import schedule
            sched = schedule(graph)
            kernels = sorted("+".join(dict(graph.node(i).attrs).get("wrt", graph.node(i).op.value) for i in k.nodes
                                      if graph.node(i).op.value in ("attn_grad", "attn_lse", "sum", "unindex"))
                             for k in sched.kernels if k.kind in ("flash", "attention"))
            placing = sum(1 for k in sched.kernels if any(graph.node(i).op.value == "unindex" for i in k.nodes)
                          and k.kind != "flash")
            from xgbuild.compiler.codegen.templates import template
            merged = [template("attention").spec(sched, k)[0].strided_out for k in sched.kernels
                      if k.kind == "attention"]
            engine = engine_of(compiled)
            for dims in dims_list:
                sig = {s["name"]: (s["dtype"], tuple(dims[d] if isinstance(d, str) else d for d in s["shape"]))
                       for s in engine.signature}
                for bm, bn in configs:
                    def choose(job, config, bm=bm, bn=bn):
                        if job.spec.kind == "attention" and bm > bn:
                            # v's columns in several programs: the first block's write the lse.
                            return {**config, "BLOCK_DV": 16}
                        return {**config, "BLOCK_M": bm, "BLOCK_N": bn} if job.spec.kind == "flash" else config
                    out = check_graph(graph, [random_inputs(sig, 0)], dims, choose=choose)
                    key = f"{name} T{dims['T']} S{dims['S']} {bm}x{bn}"
                    report[key] = {"flash_grads": flash, "kernels": kernels, "placing": placing,
                                   "merged": merged, "rel_err": max(o["rel_err"] for o in out)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
