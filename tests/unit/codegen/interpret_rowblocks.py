"""The element-wise kernel's row blocks (`ROWBLOCK`: BLOCK elements of one row a program) under
Triton's interpreter (CPU) against the float64 reference, every job whose last dim allows them
forced to a few row-block configs: per-row and per-column broadcasts, a transposed operand, a
view of a slice, an unindex (a slice's gradient), 2 and 3 dims, rows no multiple of the block;
and row tiles (`COLS`: several short rows a program) on attention's head gradients placed into a
fused [B, T, 3, H, DH] tensor and on rows of 20 and 16.
Prints, as JSON, each case's errors and the configs its element-wise launches ran. A script, not
a test: TRITON_INTERPRET must be set before Triton is imported.

    python tests/unit/codegen/interpret_rowblocks.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
from xgbuild.compiler.codegen.templates.base import next_pow2
from xgbuild.runtime import interpret

CASES = {   # name: (source, input shapes)
    "broadcasts": ("""extern Tensor[float32, 5, 600] X
extern Tensor[float32, 5, 1] A
extern Tensor[float32, 600] B
extern Tensor[float32, 600, 5] Y
def main() {
    return exp(X * A * 0.1) + B - transpose(Y, 0, 1), X[:, 0:550] * 2.0
}
""", {"X": (5, 600), "A": (5, 1), "B": (600,), "Y": (600, 5)}),
    "three_dims": ("""extern Tensor[float32, 2, 3, 700] X
extern Tensor[float32, 3, 1] A
def main() {
    return tanh(X) * A
}
""", {"X": (2, 3, 700), "A": (3, 1)}),
    "unindex": ("""extern Tensor[float32, 4, 520] X
extern Tensor[float32, 4, 700] G
def f(Tensor[float32, 4, 700] g, Tensor[float32, 4, 520] x) -> float32 {
    return sum(g[:, 90:610] * x)
}
def main() {
    return grad(f, wrt=(g))(G, X)
}
""", {"X": (4, 520), "G": (4, 700)}),
    # Row tiles (`COLS`): rows shorter than a block, several a program.
    # Attention's head gradients placed into a fused [B, T, 3, H, DH] tensor (an unindex per head
    # through a transpose), rows no power of two and fewer than a tile.
    "heads": ("""extern Tensor[float32, 10, 144] QKV
extern Tensor[float32, 2, 3, 5, 48] G
def heads(Tensor[float32, 10, 48] x) -> Tensor[float32, 2, 3, 5, 16] {
    return transpose(reshape(x, [2, 5, 3, 16]), dim0=1, dim1=2)
}
def f(Tensor[float32, 10, 144] qkv, Tensor[float32, 2, 3, 5, 48] g) -> float32 {
    return (sum(heads(qkv[:, 0:48]) * g[:, :, :, 0:16]) + sum(heads(qkv[:, 48:96]) * g[:, :, :, 16:32])
            + sum(exp(heads(qkv[:, 96:144]) * 0.1) * g[:, :, :, 32:48]))
}
def main() {
    return grad(f, wrt=(qkv))(QKV, G)
}
""", {"QKV": (10, 144), "G": (2, 3, 5, 48)}),
    "short_rows": ("""extern Tensor[float32, 37, 20] X
extern Tensor[float32, 37, 1] A
extern Tensor[float32, 20] B
extern Tensor[float32, 20, 37] Y
def main() {
    return exp(X * A * 0.1) + B - transpose(Y, 0, 1), X[:, 2:18] * 2.0, transpose(Y, 0, 1) * 0.0 + 1.5
}
""", {"X": (37, 20), "A": (37, 1), "B": (20,), "Y": (20, 37)}),
}
CONFIGS = [{"BLOCK": 256, "num_warps": 2, "num_stages": 1, "ROWBLOCK": 1},
           {"BLOCK": 512, "num_warps": 4, "num_stages": 1, "ROWBLOCK": 1}]
# Row tiles: COLS the smallest power of two covering the row, or fewer (two tiles a row).
TILES = [{"BLOCK": 256, "num_warps": 2, "num_stages": 1, "ROWBLOCK": 1, "COLS": 0},
         {"BLOCK": 128, "num_warps": 4, "num_stages": 1, "ROWBLOCK": 1, "COLS": -1}]


def report(device: str = "cpu") -> dict:
    """Each case at each config: errors, the check flag, the row-block and tile launches. On
    "cuda" the same kernels run compiled for the local GPU (tests/gpu/test_row_tiles_cuda.py)."""
    from xgbuild.compiler.driver import compile_source
    launched: list[dict] = []
    run = interpret.launch

    def launch(c, grid, args):
        if "BLOCK" in c.config and "BLOCK_M" not in c.config:
            launched.append(c.config)
        run(c, grid, args)
    interpret.launch = launch
    out_report = {}
    for name, (src, shapes) in CASES.items():
        graph = compile_source(src, f"{name}.xg").optimized.main
        g = torch.Generator().manual_seed(len(out_report))
        values = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
        for i, cfg in enumerate(CONFIGS + TILES):
            def choose(job, config, cfg=cfg):
                if job.spec.kind != "elementwise" or job.problem.cols < (16 if "COLS" in cfg else 512):
                    return config
                if "COLS" in cfg:       # the smallest power of two covering the row, or half of it
                    cols = min(next_pow2(job.problem.cols), cfg["BLOCK"])
                    return {**cfg, "COLS": cols if cfg["COLS"] == 0 else cols // 2}
                return cfg

            launched.clear()
            out = check_graph(graph, values, {}, choose=choose, device=device)
            bad = {k: v.clone() for k, v in values.items()}
            first = next(iter(bad))
            bad[first].view(-1)[-1] = float("nan")        # the last row's last block
            flag = check_graph(graph, bad, {}, choose=choose, check=True, device=device)[0].get("flag", 0)
            out_report[f"{name} {i}"] = {"errors": [r["rel_err"] for r in out], "flag": flag,
                                         "rowblocks": sum(1 for c in launched if c.get("ROWBLOCK")),
                                         "tiles": sum(1 for c in launched if c.get("COLS")),
                                         "flat": sum(1 for c in launched if not c.get("ROWBLOCK"))}
    interpret.launch = run
    return out_report


if __name__ == "__main__":
    interpret.enable()
    print(json.dumps(report()))
