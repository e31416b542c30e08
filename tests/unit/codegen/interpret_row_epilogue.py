"""Llama's RMSNorm after a product (`h = r + x @ w`; `h.float() * rsqrt(mean(h.float()^2) + eps)`,
cast back and scaled): one row kernel, whose reduction squares one widening cast of h and whose
epilogue multiplies the other (fork-casts gives each reader its own). Runs under Triton's
interpreter (CPU) against the float64 reference with the row kernel forced to a whole-row tile and
to column tiles (rows of 96 in blocks of 32), and prints, as JSON, the kernels and each output's
error per config. A script, not a test: TRITON_INTERPRET must be set before Triton is imported, so
the test runs it in a fresh process.

    python tests/unit/codegen/interpret_row_epilogue.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret

SOURCE = """T = 40
D = 96
extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, D, D] W
extern Tensor[bfloat16, T, D] R
extern Tensor[bfloat16, D] G
def main() {
    h = R + X @ W
    f = cast(h, float32)
    y = f * rsqrt(mean(f * f, dim=1, keepdim=true) + 1e-6)
    return G * cast(y, bfloat16), h
}
"""
# Cross-entropy over bf16 logits (std.nn, as GPT-2's loss): the row max, then exp(x - max) summed
# in the same row kernel (the max's epilogue), each row read in tiles when it is long.
CROSS_ENTROPY = """import std.nn
N = 24
V = 300
extern Tensor[bfloat16, N, V] Z
extern Tensor[int64, N] Y
def main() {
    return cross_entropy(cast(Z, float32), Y)
}
"""
CONFIGS = {"whole": {"BLOCK_N": 128, "SINGLE": 1, "num_warps": 4, "num_stages": 1},
           "tiles": {"BLOCK_N": 32, "SINGLE": 0, "num_warps": 2, "num_stages": 1}}


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_source
    graph = compile_source(SOURCE, "row_epilogue.xg").optimized.main
    g = torch.Generator().manual_seed(0)
    values = {"X": torch.randn(40, 96, generator=g).bfloat16(), "W": (torch.randn(96, 96, generator=g) / 10).bfloat16(),
              "R": torch.randn(40, 96, generator=g).bfloat16(), "G": (torch.rand(96, generator=g) + 0.5).bfloat16()}
    # PyTorch eager in the program's dtypes, against float64: the error each output may have
    x, w, r, gain = (values[k] for k in "XWRG")
    h = r + x @ w
    f = h.float()
    y = gain * (f * torch.rsqrt((f * f).mean(dim=1, keepdim=True) + 1e-6)).bfloat16()
    xd, wd, rd, gd = (t.double() for t in (x, w, r, gain))
    hd = rd + xd @ wd
    yd = gd * hd * torch.rsqrt((hd * hd).mean(dim=1, keepdim=True) + 1e-6)
    eager = [float((y.double() - yd).norm() / yd.norm()), float((h.double() - hd).norm() / hd.norm())]
    report = {"kinds": [k.kind for k in schedule(graph).kernels], "eager": eager,
              "casts": sum(n.op.value == "cast" and n.dtype == "float32" for n in graph.nodes)}
    run = interpret.launch
    for name, cfg in CONFIGS.items():
        launched: list[dict] = []

        def launch(c, grid, args, launched=launched):       # each row kernel's config, as it ran
            if "SINGLE" in c.config:
                launched.append(c.config)
            run(c, grid, args)
        interpret.launch = launch

        def choose(job, config, cfg=cfg):
            return cfg if job.spec.kind == "rowwise" else config
        report[name] = {"outputs": check_graph(graph, values, {}, choose=choose), "launched": launched}
    interpret.launch = run
    ce = compile_source(CROSS_ENTROPY, "cross_entropy.xg").optimized.main
    report["ce_kinds"] = [k.kind for k in schedule(ce).kernels]
    ce_values = {"Z": (torch.randn(24, 300, generator=g) * 3).bfloat16(), "Y": torch.randint(0, 300, (24,), generator=g)}
    for name, cfg in (("ce_whole", {**CONFIGS["whole"], "BLOCK_N": 512}), ("ce_tiles", {**CONFIGS["tiles"], "BLOCK_N": 64})):
        def choose(job, config, cfg=cfg):
            return cfg if job.spec.kind == "rowwise" and not job.problem.columns else config
        report[name] = check_graph(ce, ce_values, {}, choose=choose)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
