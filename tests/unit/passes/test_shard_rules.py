"""The layout rules, op by op, without starting ranks: every rank's local graph is run in lockstep in
this process (collectives combine the ranks' values the way their definitions say), the pieces are
joined by the output layouts, and the result must equal the whole program run in float64.

This checks the pass and `ir/layout.py` on many shapes and ops quickly; the real collectives
(gloo ranks, `torch.distributed`) are tested end to end in tests/e2e/test_distributed.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.shard_plan import load_plan
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.ir.layout import split_inputs
from xgbuild.runtime.cpu import CpuExecutor
from xgbuild.runtime.engine import Engine
from xgbuild.runtime.spmd import local_graph

REPO = Path(__file__).resolve().parents[3]


def lockstep(engine: Engine, inputs: dict[str, torch.Tensor], n: int) -> dict[int, torch.Tensor]:
    """Each output of `engine` computed by n simulated ranks, joined."""
    graph, _, _ = engine.specialised(inputs)
    local, layouts = local_graph(graph, n)
    split = split_inputs(graph)
    split_ids = {nid for name, nid in graph.inputs if name in split}
    ops = CpuExecutor(float64=True, check=False, timings=False)
    per_rank = [{k: (v.chunk(n, split[k])[r] if k in split else v) for k, v in inputs.items()} for r in range(n)]
    vals: list[dict[int, torch.Tensor]] = [{} for _ in range(n)]
    for node in local.nodes:
        args = [[vals[r][i] for i in node.inputs] for r in range(n)]
        for r in range(n):
            x = args[r][0] if args[r] else None
            if node.op is Op.SHARD:
                out = x if node.inputs[0] in split_ids else x.chunk(n, node.attr("dim"))[r]
            elif node.op is Op.ALL_GATHER:
                out = torch.cat([a[0] for a in args], node.attr("dim"))
            elif node.op is Op.ALL_REDUCE:
                out = sum(a[0] for a in args)
            elif node.op is Op.REDUCE_SCATTER:
                out = sum(a[0] for a in args).chunk(n, node.attr("dim"))[r]
            elif node.op is Op.ALL_TO_ALL:
                out = torch.cat([a[0].chunk(n, node.attr("dim"))[r] for a in args], node.attr("src"))
            else:
                out = ops.eval(node, args[r], per_rank[r])
                want = ops.dtype(node.dtype)
                out = out if out.dtype == want else out.to(want)
            assert tuple(out.shape) == tuple(node.shape), f"rank {r}: %{node.id} {node.op.value}"
            vals[r][node.id] = out
    joined = {}
    for i in tree_ids(graph.output):
        lay = layouts[i]
        assert lay.kind != "P", "a partial sum left the program"
        joined[i] = torch.cat([vals[r][i] for r in range(n)], lay.dim) if lay.kind == "S" else vals[0][i]
    return joined


def check(engine: Engine, inputs: dict[str, torch.Tensor], n: int, tol: float = 1e-9) -> None:
    ref_graph, _, _ = engine.specialised(inputs)
    ref = CpuExecutor(float64=True, check=False).run(ref_graph, inputs).values
    got = lockstep(engine, inputs, n)
    for i, want in ref.items():
        w, g = want.double(), got[i].double()
        scale = float(w.norm()) or 1.0
        assert float((g - w).norm()) / scale < tol, f"output %{i}"


PROGRAMS = {
    "softmax-rows": ("extern Tensor[float32, 8, 12] X\ndef main() {\n    with shard(X, dim=0):\n"
                     "        y = softmax(X * 2.0, dim=1)\n    return (y, softmax(X, dim=0))\n}\n"),
    "transpose-reshape": ("extern Tensor[float32, 8, 4, 6] X\ndef main() {\n    with shard(X, dim=0):\n"
                          "        y = reshape(transpose(X, 1, 2), [8, 24])\n        z = transpose(X, 0, 2)\n"
                          "    return (y, z, sum(y, dim=1, keepdim=true))\n}\n"),
    "batched-matmul": ("extern Tensor[float32, 4, 8, 8] A\nextern Tensor[float32, 4, 8, 2] B\n"
                       "def main() {\n    with shard(A, dim=0), shard(B, dim=0):\n        c = A @ B\n"
                       "    with shard(c, dim=1):\n        d = relu(c)\n    return (c, d, max(d, dim=1))\n}\n"),
    "broadcast-reduce": ("extern Tensor[float32, 8, 12] X\nextern Tensor[float32, 12] G\n"
                         "def main() {\n    with shard(X, dim=1), shard(G, dim=0):\n        y = X * G + G\n"
                         "        m = mean(y, dim=1, keepdim=true)\n        s = sum(y)\n"
                         "    return (y - m, s, mean(y), max(y, dim=0))\n}\n"),
    "where-compare": ("extern Tensor[float32, 8, 4] X\nextern Tensor[float32, 8, 4] Y\n"
                      "def main() {\n    with shard(X, dim=0), shard(Y, dim=1):\n"
                      "        z = where(X > Y, X - Y, Y * 0.5)\n    return (z, sum(z, dim=0))\n}\n"),
    "contract-then-reshard": ("extern Tensor[float32, 8, 16] A\nextern Tensor[float32, 16, 8] B\n"
                              "def main() {\n    with shard(A, dim=1), shard(B, dim=0):\n        c = A @ B\n"
                              "    with shard(c, dim=0):\n        d = exp(c * 0.1)\n"
                              "    with shard(d, dim=1):\n        e = d * 2.0\n    return (e, -c)\n}\n"),
    "index-and-its-gradient": ("extern Tensor[float32, 8, 6, 4] X\nextern Tensor[float32, 8, 4] W\n"
                               "def f(Tensor[float32, 8, 6, 4] x, Tensor[float32, 8, 4] w) -> float32 {\n"
                               "    return sum(x[:, 1:5, 2] * x[:, 0, 0:3][:, 0:1] + x[:, 2] * w)\n}\n"
                               "def main() {\n    with shard(X, dim=0), shard(W, dim=0):\n"
                               "        (v, g) = value_and_grad(f, wrt=x)(X, W)\n        h = X[:, 1:3]\n"
                               "    return (v, g, h)\n}\n"),
    "index-trailing-split": ("extern Tensor[float32, 4, 6, 8] X\ndef main() {\n    with shard(X, dim=2):\n"
                             "        y = X[1] * 2.0\n        z = X[:, 2:4]\n        w = X[0, 1, 0:4]\n"
                             "    return (y, z, w)\n}\n"),
}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_under_sharding_equal_one_process(name: str, n: int) -> None:
    c = compile_source(f"NUM_GPU = {n}\n" + PROGRAMS[name], f"{name}.xg", verify_each=True)
    engine = engine_of(c)
    gen = torch.Generator().manual_seed(n)
    inputs = {spec["name"]: torch.randn(tuple(spec["shape"]), generator=gen) for spec in engine.signature}
    check(engine, inputs, n)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("plan", ["train_tensor", "train_data"])
def test_training_step_under_each_plan(plan: str, n: int) -> None:
    c = compile_file(REPO / "models" / "train_tiny.xg", CheckOptions(num_gpu=n),
                     plan=load_plan(REPO / "models" / "plans" / f"{plan}.toml"))
    engine = engine_of(c)
    gen = torch.Generator().manual_seed(7)
    inputs = {}
    for spec in engine.signature:
        shape, name = tuple(spec["shape"]), spec["name"]
        if spec["dtype"] == "int64":
            inputs[name] = torch.randint(0, 16, shape, generator=gen)
        elif name in ("STEP", "LR"):
            inputs[name] = torch.tensor(3.0 if name == "STEP" else 0.01)
        elif name.startswith("V_"):
            inputs[name] = torch.rand(shape, generator=gen) * 1e-3 + 1e-3
        else:
            inputs[name] = torch.randn(shape, generator=gen) * 0.1
    check(engine, inputs, n, tol=1e-9)
