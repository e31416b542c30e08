"""Row blocks on one GPU: the launches of a reduced matmul in blocks of rows (XG_COMM_BLOCKS) run
the engine's cubins on views at row offsets; with a stand-in for the collectives (rank 0 of two
ranks holding the same pieces: a sum is twice the piece) the result equals the whole launch's
and the float64 reference, for an all-reduce in place (an epilogue reading a whole operand) and a
reduce-scatter (rows of every part), row counts that fall into unequal blocks included. The
NCCL runs are in test_multi_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_target import local_target

from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.hw import load_profile
from xgbuild.runtime.cuda import KernelLauncher
from xgbuild.runtime.engine import Engine
from xgbuild.runtime.gpu import KernelExecutor
from xgbuild.runtime.plans import plans_from_manifest
from xgbuild.runtime.spmd import local_graph
from xgbuild.tuner.link import build_kernels

pytestmark = pytest.mark.gpu

SOURCE = """
extern Tensor[{dt}, {m}, 512] A
extern Tensor[{dt}, 512, 256] B
extern Tensor[{dt}, {m}, 256] C
extern Tensor[{dt}, 512, {m}] Z
extern Tensor[{dt}, 512, 256] E
def main() {{
    with shard(A, dim=1), shard(B, dim=0):
        p = (A @ B) * C
    with shard(Z, dim=0), shard(E, dim=0):
        q = transpose(Z) @ E
    with shard(q, dim=0):
        r = relu(q)
    return (p, r)
}}
"""


def stand_in(n, x, in_place: bool = False, into=None):
    """Rank 0 of two ranks with equal pieces: an all-reduce doubles its (in-place) input; a
    reduce-scatter's share is twice rank 0's piece."""
    if into is not None:
        return into.copy_(x[0] * 2)
    if n.op is Op.ALL_REDUCE:
        return x.mul_(2) if in_place else x * 2
    if n.op is Op.REDUCE_SCATTER:
        return (x * 2).chunk(2, n.attr("dim"))[0].contiguous()
    return x


@pytest.mark.parametrize("dtype,m", [("float32", 1024), ("bfloat16", 1000)])
def test_row_blocks_match_the_whole_launch(tmp_path: Path, dtype: str, m: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    target = local_target()
    compiled = compile_source(SOURCE.format(dt=dtype, m=m), "blocks.xg", CheckOptions(num_gpu=2, target=target))
    engine_of(compiled, build_kernels(compiled.optimized.main, load_profile(target), policy="predict")) \
        .save(tmp_path / "blocks.xge")
    engine = Engine.load(tmp_path / "blocks.xge")
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    whole = {"A": (m, 512), "B": (512, 256), "C": (m, 256), "Z": (512, m), "E": (512, 256)}
    vals = {k: torch.randn(s, generator=gen, dtype=torch.float64) / (s[0] ** 0.5 if k in "BE" else 1)
            for k, s in whole.items()}
    # Rank 0's pieces: A's first half of columns, B's, Z's and E's first half of rows.
    local_vals = {"A": vals["A"][:, :256], "B": vals["B"][:256], "C": vals["C"], "Z": vals["Z"][:256],
                  "E": vals["E"][:256]}
    inputs = engine.prepare_inputs({k: v.to(torch_dtype).cuda() for k, v in vals.items()}, "cuda")
    graph, _, _ = engine.specialised(inputs)
    local, _ = local_graph(graph, 2)
    local_inputs = {k: v.to(torch_dtype).contiguous().cuda() for k, v in local_vals.items()}
    launcher = KernelLauncher(torch.cuda.current_device())
    plans = plans_from_manifest(engine.manifest, engine.file.entries)
    q = 2 * (local_vals["Z"].T @ local_vals["E"])
    want = [2 * (local_vals["A"] @ local_vals["B"]) * vals["C"], torch.relu(q[: m // 2])]
    results = {}
    for blocks in (1, 4):
        ex = KernelExecutor(plans, lambda c, grid, args: launcher.launch(c.handle, grid, args), torch.device("cuda"),
                            collective=stand_in, row_blocks=blocks, world=2)
        with torch.no_grad():
            outs = ex.run(local, local_inputs)
        torch.cuda.synchronize()
        assert (ex.split_collectives == 2) == (blocks == 4), ex.split_collectives
        results[blocks] = [outs[i].double().cpu() for i in tree_ids(local.output)]
        for got, ref in zip(results[blocks], want):
            err = float((got - ref).norm() / ref.norm())
            assert err < (1e-4 if dtype == "float32" else 3e-2), (blocks, err)
    for a, b in zip(results[1], results[4]):
        assert torch.equal(a, b) or float((a - b).norm() / b.norm()) < 1e-6
