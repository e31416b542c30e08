"""The element-wise kernel's row blocks (`ROWBLOCK`: BLOCK elements of one row a program) under
Triton's interpreter (CPU) against the float64 reference, every job whose last dim allows them
forced to a few row-block configs: per-row and per-column broadcasts, a transposed operand, a
view of a slice, an unindex (a slice's gradient), 2 and 3 dims, rows no multiple of the block.
Prints, as JSON, each case's errors and the configs its element-wise launches ran. A script, not
a test: TRITON_INTERPRET must be set before Triton is imported.

    python tests/unit/codegen/interpret_rowblocks.py
"""

from __future__ import annotations

import json

import torch

from xgbuild.build.interpreted import check_graph
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
}
CONFIGS = [{"BLOCK": 256, "num_warps": 2, "num_stages": 1, "ROWBLOCK": 1},
           {"BLOCK": 512, "num_warps": 4, "num_stages": 1, "ROWBLOCK": 1}]


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.driver import compile_source
    launched: list[dict] = []
    run = interpret.launch

    def launch(c, grid, args):
        if "BLOCK" in c.config and "BLOCK_M" not in c.config:
            launched.append(c.config)
        run(c, grid, args)
    interpret.launch = launch
    report = {}
    for name, (src, shapes) in CASES.items():
        graph = compile_source(src, f"{name}.xg").optimized.main
        g = torch.Generator().manual_seed(len(report))
        values = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
        for i, cfg in enumerate(CONFIGS):
            def choose(job, config, cfg=cfg):
                return cfg if job.spec.kind == "elementwise" and job.problem.cols >= 512 else config

            launched.clear()
            out = check_graph(graph, values, {}, choose=choose)
            bad = {k: v.clone() for k, v in values.items()}
            first = next(iter(bad))
            bad[first].view(-1)[-1] = float("nan")        # the last row's last block
            flag = check_graph(graph, bad, {}, choose=choose, check=True)[0].get("flag", 0)
            report[f"{name} {i}"] = {"errors": [r["rel_err"] for r in out], "flag": flag,
                                     "rowblocks": sum(1 for c in launched if c.get("ROWBLOCK")),
                                     "flat": sum(1 for c in launched if not c.get("ROWBLOCK"))}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
