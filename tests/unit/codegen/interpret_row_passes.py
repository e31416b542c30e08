"""A row kernel's reductions in as few walks along the row as their dependencies allow
(`triton_src.row_passes`): softmax's statistics and a spelled-out log-sum-exp online (one walk, the
sum rescaled as the running max rises), an independent sum in the same walk, a variance in a
second walk after its mean. Runs under Triton's interpreter (CPU) with rows of 300 in tiles of 64
and whole, against the float64 reference, on rows that test the online sum's edges: all -inf, -inf
for the first tiles then finite, a NaN, a +inf, large values. Prints the kernels' pass plans and
each output's error per config as JSON. A script, not a test: TRITON_INTERPRET must be set before
Triton is imported, so the test runs it in a fresh process.

    python tests/unit/codegen/interpret_row_passes.py
"""

from __future__ import annotations

import json

import torch

from interpret_row_epilogue import CROSS_ENTROPY

from xgbuild.build.interpreted import check_graph
from xgbuild.runtime import interpret

SOURCE = """R = 7
V = 300
extern Tensor[float32, R, V] X
extern Tensor[float32, R, V] W
def main() {
    m = max(X, dim=1, keepdim=true)
    s = sum(exp(X - m), dim=1, keepdim=true)
    mu = mean(W, dim=1, keepdim=true)
    var = mean((W - mu) * (W - mu), dim=1)
    return softmax(X, dim=1), log_softmax(X, dim=1), m, s, m + log(s), sum(X * W, dim=1), var
}
"""
# Cross-entropy over bf16 logits (std.nn, GPT-2's loss; interpret_row_epilogue's program): the
# log-sum-exp and the target's logit (`sum(onehot * x)`, a row kernel of its own before) over the
# same rows: one kernel, one walk.
CONFIGS = {"whole": {"BLOCK_N": 512, "SINGLE": 1, "num_warps": 4, "num_stages": 1},
           "tiles": {"BLOCK_N": 64, "SINGLE": 0, "num_warps": 2, "num_stages": 1}}


def special_rows(g: torch.Generator) -> torch.Tensor:
    x = torch.randn(7, 300, generator=g, dtype=torch.float64).float() * 3
    inf = float("inf")
    x[1] = -inf                     # every element -inf: NaN statistics, as two walks give
    x[2, :150] = -inf               # the first tiles -inf, then finite
    x[3, 200] = float("nan")        # a NaN late in the row
    x[4, 10] = inf                  # +inf early in the row
    x[5] *= 40                      # large values: the running max rises tile after tile
    x[6] = torch.linspace(-50, 50, 300)   # rising along the row: a rescale at every tile
    return x


def pass_plans(graph) -> list[list]:
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import template
    from xgbuild.compiler.codegen.triton_src import row_passes
    sched = schedule(graph)
    plans = []
    for k in sched.kernels:
        if k.kind == "rowwise":
            spec, _ = template("rowwise").spec(sched, k)
            plan = row_passes(spec)
            plans.append([[agg for _k, agg, _n in p] for p in plan.passes] + [len(plan.online)])
    return plans


def main() -> None:
    interpret.enable()
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.driver import compile_source
    g = torch.Generator().manual_seed(0)
    report: dict = {}
    for name, source, values in (
            ("rows", SOURCE, {"X": special_rows(g), "W": torch.randn(7, 300, generator=g)}),
            ("ce", CROSS_ENTROPY, {"Z": (torch.randn(24, 300, generator=g) * 3).bfloat16(),
                                   "Y": torch.randint(0, 300, (24,), generator=g)})):
        graph = compile_source(source, f"{name}.xg").optimized.main
        report[name] = {"kinds": [k.kind for k in schedule(graph).kernels], "plans": pass_plans(graph)}
        for cname, cfg in CONFIGS.items():
            def choose(job, config, cfg=cfg):
                return cfg if job.spec.kind == "rowwise" and not job.problem.columns else config
            report[name][cname] = check_graph(graph, values, {}, choose=choose)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
