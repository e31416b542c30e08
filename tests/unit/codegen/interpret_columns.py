"""The row-reduction kernel's column form (`ROWS` rows a program along the last kept dim) under
Triton's interpreter (CPU) against the float64 reference, every such job forced to each of a few
column configs: one kept dim (a bias's gradient), two and three (a split reduction's first stage),
a last kept dim that no ROWS divides, a transposed operand, max with a NaN, bfloat16 rows (also
widened through a view, the cast the kernel's prologue), short rows reduced along the last dim,
LayerNorm's weight and bias gradients sharing a first stage, the MLP's bias gradient writing the
bfloat16 cast of what it sums (also in the one-row forms). Prints,
as JSON, each case's errors under each config and the configs the column jobs ran. A script, not a
test: TRITON_INTERPRET must be set before Triton is imported, so the test runs it in a fresh
process.

    python tests/unit/codegen/interpret_columns.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret

CASES = {   # name: (source, input shapes and dtypes, the sizes it is tuned at)
    "bias": ("extern Tensor[float32, T, D] Y\ndef main() {\n    return sum(Y * 2.0, dim=0)\n}\n",
             {"Y": ((50, 37), torch.float32)}, {"T": 50, "D": 37}),
    "split": ("extern Tensor[float32, B, S, D] Z\ndef main() {\n    return sum(Z, dim=1), mean(exp(Z * 0.5), dim=1)\n}\n",
              {"Z": ((5, 24, 37), torch.float32)}, {"B": 5, "S": 24, "D": 37}),
    "three": ("extern Tensor[float32, A, S, B, D] X\ndef main() {\n    return max(X, dim=1), min(X, dim=1)\n}\n",
              {"X": ((3, 9, 4, 40), torch.float32)}, {"A": 3, "S": 9, "B": 4, "D": 40}),
    "transposed": ("extern Tensor[float32, T, D] Y\ndef main() {\n    return sum(transpose(Y, 0, 1) * 3.0, dim=1)\n}\n",
                   {"Y": ((33, 70), torch.float32)}, {"T": 33, "D": 70}),
    "bf16": ("extern Tensor[bfloat16, T, D] H\ndef main() {\n    return sum(cast(H, float32), dim=0)\n}\n",
             {"H": ((64, 48), torch.bfloat16)}, {"T": 64, "D": 48}),
    # A widened bfloat16 value summed through a view (a split reduction's first stage): the cast
    # moves below the view (passes/cast_views.py) and is the column kernel's prologue.
    "bf16t": ("B = 4\nS = 16\nD = 48\nextern Tensor[bfloat16, 64, D] H\ndef main() {\n"
              "    return sum(reshape(cast(H, float32), [B, S, D]), dim=1)\n}\n",
              {"H": ((64, 48), torch.bfloat16)}, {}),
    # Short rows (attention's sum(dO * O, dim=-1) over heads of DH): many rows a program, one
    # operand read through a transpose, rows of 20 and a last kept dim of 37 that no ROWS divides.
    "short": ("B = 2\nT = 37\nH = 3\nDH = 20\nextern Tensor[bfloat16, B, T, H, DH] G\n"
              "extern Tensor[bfloat16, B, H, T, DH] O\ndef main() {\n"
              "    return sum(cast(transpose(G, 1, 2), float32) * cast(O, float32), dim=3)\n}\n",
              {"G": ((2, 37, 3, 20), torch.bfloat16), "O": ((2, 3, 37, 20), torch.bfloat16)}, {}),
    # LayerNorm's weight and bias gradients: both first stages in one kernel, the product of dy
    # and the normalised input its prologue over views of [T / 64, 64, D] (passes/split_reductions.py).
    "lngrad": ("extern Tensor[bfloat16, 1024, 24] DY\nextern Tensor[float32, 1024, 24] X\n"
               "extern Tensor[float32, 1024, 1] M\nextern Tensor[float32, 1024, 1] R\ndef main() {\n"
               "    dy = cast(DY, float32)\n    return sum(dy * ((X - M) * R), dim=0), sum(dy, dim=0)\n}\n",
               {"DY": ((1024, 24), torch.bfloat16), "X": ((1024, 24), torch.float32),
                "M": ((1024, 1), torch.float32), "R": ((1024, 1), torch.float32)}, {}),
    # The MLP's bias gradient (passes/split_reductions.py): the tanh GELU's gradient summed over
    # the tokens and cast to bfloat16 for the products. Its ops are rebuilt in the split shape
    # [T / 64, 64, D] and the first stage writes the cast through its strides beside the sums.
    "bf16cast": ("extern Tensor[bfloat16, 1024, 40] A\nextern Tensor[float32, 40] B\n"
                 "extern Tensor[bfloat16, 1024, 40] G\ndef main() {\n"
                 "    u = cast(A, float32) + B\n    t = tanh(0.79788456 * (u + 0.044715 * u * u * u))\n"
                 "    d = cast(G, float32) * (0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * 0.79788456 * "
                 "(1.0 + 0.134145 * u * u))\n"
                 "    return sum(d, dim=0), cast(d, bfloat16)\n}\n",
                 {"A": ((1024, 40), torch.bfloat16), "B": ((40,), torch.float32),
                  "G": ((1024, 40), torch.bfloat16)}, {}),
}
CONFIGS = [{"BLOCK_N": 8, "ROWS": 16, "SINGLE": 0, "num_warps": 2, "num_stages": 1},
           {"BLOCK_N": 16, "ROWS": 32, "SINGLE": 0, "num_warps": 4, "num_stages": 1},
           {"BLOCK_N": 4, "ROWS": 64, "SINGLE": 0, "num_warps": 2, "num_stages": 1}]

ONE_ROW = {"looped": {"BLOCK_N": 16, "SINGLE": 0, "num_warps": 2, "num_stages": 1},
           "single": {"BLOCK_N": 64, "SINGLE": 1, "num_warps": 2, "num_stages": 1}}


def report(device: str = "cpu") -> dict:
    """Each case at each forced config: errors and the row kernels' ROWS as they ran. On "cuda" the
    same kernels run compiled for the local GPU (tests/gpu/test_column_reductions_cuda.py)."""
    from xgbuild.compiler.driver import compile_source
    launched: list[dict] = []
    run = interpret.launch

    def launch(c, grid, args):          # every rowwise launch's config, as it ran
        if "ROWS" in c.config or "SINGLE" in c.config:
            launched.append(c.config)
        run(c, grid, args)
    interpret.launch = launch
    out_report = {}
    for name, (src, shapes, dims) in CASES.items():
        graph = compile_source(src, f"{name}.xg").optimized.main
        g = torch.Generator().manual_seed(len(out_report))
        values = {k: torch.randn(s, generator=g).to(dt) for k, (s, dt) in shapes.items()}
        if name == "three":
            values["X"][1, 4, 2, 7] = float("nan")
        forced = {str(i): (cfg, lambda job: job.problem.columns or job.problem.short_rows)
                  for i, cfg in enumerate(CONFIGS)}
        if name == "bf16cast":      # the one-row forms write the cast through its strides too
            forced |= {form: (cfg, lambda job: job.problem.columns) for form, cfg in ONE_ROW.items()}
        for key, (cfg, column) in forced.items():
            def choose(job, config, cfg=cfg, column=column):
                return cfg if job.spec.kind == "rowwise" and column(job) else config

            launched.clear()
            out = check_graph(graph, values, dims, choose=choose, device=device)
            out_report[f"{name} {key}"] = {"errors": [r["rel_err"] for r in out],
                                           "rowwise": [c.get("ROWS", 0) for c in launched]}
    interpret.launch = run
    return out_report


if __name__ == "__main__":
    interpret.enable()
    print(json.dumps(report()))
