"""Matmul epilogues run over column slices of the tile (`SUBTILES`) under Triton's interpreter
(CPU) against the float64 reference: 2 and 4 slices, one program a tile and persistent (with
descriptors), sizes no multiple of the tile or of a slice, an epilogue reading a bias, a full
operand and the product twice; in check mode, the flag of a clean run and of one with a NaN in
the last slice's columns. Prints, as JSON, each case's errors, flags and whether its kernel split
the accumulator. A script, not a test: TRITON_INTERPRET must be set before Triton is imported.

    python tests/unit/codegen/interpret_subtiles.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.codegen.templates import emit
from xgbuild.runtime import interpret

SOURCE = """extern Tensor[float32, M, K] A
extern Tensor[float32, K, N] B
extern Tensor[float32, N] Bias
extern Tensor[float32, M, N] G
def main() {
    return gelu(A @ B + Bias) * G + tanh(A @ B) * 0.5
}
"""
SHAPES = {"A": (40, 48), "B": (48, 80), "Bias": (80,), "G": (40, 80)}
DIMS = {"M": 40, "N": 80, "K": 48}
TILE = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2, "TF32X3": 0, "num_warps": 4, "num_stages": 2}
FORMS = {"tiles": {}, "persistent": {"PROGRAMS": 3}, "descriptors": {"PROGRAMS": 3, "TMA": 1}}


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.driver import compile_source
    graph = compile_source(SOURCE, "subtiles.xg").optimized.main
    g = torch.Generator().manual_seed(7)
    values = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    report = {}
    for form, extra in FORMS.items():
        for parts in (2, 4):
            split: list[bool] = []

            def choose(job, config, extra=extra, parts=parts):
                if job.spec.kind != "matmul":
                    return config
                cfg = {**TILE, **extra, "SUBTILES": parts}
                split.append("tl.split" in emit(job.spec, cfg, job.fast_variant(cfg)).source)
                return cfg

            out = check_graph(graph, values, DIMS, choose=choose)
            flags = {}
            for label, nan in (("clean", False), ("nan", True)):
                bad = {k: v.clone() for k, v in values.items()}
                if nan:
                    bad["G"][37, 79] = float("nan")     # the last slice of the last, partial tile
                flags[label] = check_graph(graph, bad, DIMS, choose=choose, check=True)[0].get("flag", 0)
            report[f"{form} {parts}"] = {"errors": [r["rel_err"] for r in out], "split": all(split) and bool(split),
                                         "variants": sorted({v for r in out for v in r["variants"]}), "flags": flags}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
