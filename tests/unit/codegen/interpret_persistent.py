"""Persistent matmuls (`PROGRAMS`, with and without tensor descriptors, `TMA`) under Triton's
interpreter (CPU) against the float64 reference: A and B each stored either way round (an
`nn.Linear` weight is B stored [N, K]), a batched product, sizes that are no multiple of the
tiles, and a bias + GELU epilogue; few programs, so that each walks several tiles. Prints, as
JSON, each case's output errors and whether its tuned kernel used descriptors, and, for the
linear layer, the check-mode flag of a clean run, of one with a NaN in A, and of that unchecked. A script, not a
test: TRITON_INTERPRET must be set before Triton is imported, so the test runs it in a fresh
process.

    python tests/unit/codegen/interpret_persistent.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.codegen.templates import emit
from xgbuild.runtime import interpret

CASES = {   # name: (source, input shapes, the sizes it is tuned at)
    "linear": ("extern Tensor[float32, M, K] A\nextern Tensor[float32, N, K] W\nextern Tensor[float32, N] Bias\n"
               "def main() {\n    return gelu(A @ transpose(W, 0, 1) + Bias)\n}\n",
               {"A": (40, 48), "W": (48, 48), "Bias": (48,)}, {"M": 40, "N": 48, "K": 48}),
    "plain": ("extern Tensor[float32, M, K] A\nextern Tensor[float32, K, N] B\n"
              "def main() {\n    return A @ B\n}\n", {"A": (33, 64), "B": (64, 80)}, {"M": 33, "N": 80, "K": 64}),
    "a_transposed": ("extern Tensor[float32, K, M] A\nextern Tensor[float32, K, N] B\n"
                     "def main() {\n    return transpose(A, 0, 1) @ B\n}\n", {"A": (48, 32), "B": (48, 48)},
                     {"M": 32, "N": 48, "K": 48}),
    "batched": ("extern Tensor[float32, 3, M, K] A\nextern Tensor[float32, 3, K, N] B\n"
                "def main() {\n    return A @ B\n}\n", {"A": (3, 24, 32), "B": (3, 32, 48)},
                {"M": 24, "N": 48, "K": 32}),
}
TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "TF32X3": 0, "num_warps": 4,
        "num_stages": 2, "PROGRAMS": 3}


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.driver import compile_source
    report = {}
    for name, (src, shapes, dims) in CASES.items():
        graph = compile_source(src, f"{name}.xg").optimized.main
        for tma in (1, 0):
            emitted: list[bool] = []

            def choose(job, config, tma=tma):
                if job.spec.kind != "matmul":
                    return config
                cfg = {**TILE, **({"TMA": 1} if tma else {})}
                emitted.append("make_tensor_descriptor" in emit(job.spec, cfg, job.fast_variant(cfg)).source)
                return cfg

            g = torch.Generator().manual_seed(len(report))
            values = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
            out = check_graph(graph, values, dims, choose=choose)
            report[f"{name} tma={tma}"] = {"errors": [r["rel_err"] for r in out], "descriptors": any(emitted),
                                           "variants": sorted({v for r in out for v in r["variants"]})}
            if name == "linear":        # check mode: the tile loop with the flag, and the one without
                flags = {}
                for label, check, nan in (("clean", True, False), ("nan", True, True), ("unchecked", False, True)):
                    bad = {k: v.clone() for k, v in values.items()}
                    if nan:
                        bad["A"][37, 5] = float("nan")      # the last, partial tile of rows
                    got = check_graph(graph, bad, dims, choose=choose, check=check)
                    flags[label] = got[0].get("flag", 0)
                report[f"{name} tma={tma}"]["flags"] = flags
    print(json.dumps(report))


if __name__ == "__main__":
    main()
