"""One rank's view, without starting ranks: the launcher's environment, per-rank input slices,
local shapes, and the SPMD executor as a world of one (collectives are identity)."""

from __future__ import annotations

import pytest
import torch

from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_source
from xgbuild.errors import InputError
from xgbuild.runtime.spmd import Group, SpmdExecutor, local_graph
from xgbuild.runtime.tensor_io import TensorIOError, load_tensor_shards, save_tensors
from xgbuild.settings import SettingsError, dist_env

ROWS = ("NUM_GPU = 2\nextern Tensor[float32, M, 6] A\nextern Tensor[float32, 6, 4] B\n"
        "def main() {\n    with shard(A, dim=0):\n        C = relu(A @ B)\n    return (C, sum(C))\n}\n")


def test_dist_env_from_torchrun_and_slurm_variables() -> None:
    assert dist_env({}) is None
    env = dist_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port) == (1, 4, 1, "h0", 29500)
    slurm = dist_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3", "MASTER_ADDR": "n1",
                      "MASTER_PORT": "1234"})
    assert (slurm.rank, slurm.world_size, slurm.local_rank) == (3, 8, 3)


@pytest.mark.parametrize("env,words", [({"RANK": "0"}, "come together"),
                                       ({"RANK": "2", "WORLD_SIZE": "2"}, "not below"),
                                       ({"RANK": "x", "WORLD_SIZE": "2"}, "not a non-negative integer"),
                                       ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT")])
def test_dist_env_refuses_what_cannot_work(env: dict, words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        dist_env(env)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_each_rank_loads_its_slice(tmp_path, suffix: str) -> None:
    a, b = torch.randn(6, 4), torch.randn(3)
    save_tensors(tmp_path / f"in{suffix}", {"A": a, "B": b})
    for rank in range(2):
        got, shapes = load_tensor_shards(tmp_path / f"in{suffix}", {"A": 1}, rank, 2)
        assert torch.equal(got["A"], a[:, 2 * rank:2 * rank + 2]) and torch.equal(got["B"], b)
        assert shapes == {"A": (6, 4)}
    with pytest.raises(TensorIOError, match="split along dimension 0 over 4 ranks"):
        load_tensor_shards(tmp_path / f"in{suffix}", {"A": 0}, 0, 4)


def test_local_shapes_divide_split_dims_and_refuse_indivisible_sizes() -> None:
    engine = engine_of(compile_source(ROWS, "rows.xg"))
    graph, _, _ = engine.specialised({"A": torch.empty(8, 6), "B": torch.empty(6, 4)})
    local, layouts = local_graph(graph, 2)
    out = local.node(local.output["tuple"][0]["t"])
    assert out.shape == (4, 4) and str(layouts[out.id]) == "S(0)"
    odd, _, _ = engine.specialised({"A": torch.empty(7, 6), "B": torch.empty(6, 4)})
    with pytest.raises(InputError, match="has size 7, which 2 ranks do not divide"):
        local_graph(odd, 2)


def test_a_world_of_one_runs_the_plan_as_one_process() -> None:
    engine = engine_of(compile_source(ROWS, "rows.xg"))
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    graph, _, _ = engine.specialised({"A": a, "B": b})
    out = SpmdExecutor(Group(0, 1), float64=True).run(graph, {"A": a, "B": b}, {})
    c, s = (out.values[t["t"]] for t in graph.output["tuple"])
    ref = torch.relu(a.double() @ b.double())
    assert float((c - ref).norm() / ref.norm()) < 1e-12 and abs(float(s) - float(ref.sum())) < 1e-9


def test_collectives_start_right_after_their_input_so_compute_overlaps_them() -> None:
    from xgbuild.compiler.ir.graph import GraphBuilder, Op, attrs_of
    from xgbuild.runtime.spmd import _comm_early
    b = GraphBuilder("g")
    x = b.add(Op.INPUT, (), "float32", (4,), attrs_of(name="x"))
    b.inputs.append(("x", x))
    y = b.add(Op.EXP, (x,), "float32", (4,))
    z = b.add(Op.NEG, (x,), "float32", (4,))          # independent of the collectives: overlaps them
    r = b.add(Op.ALL_REDUCE, (y,), "float32", (4,), attrs_of(reduce="sum"))
    g = b.add(Op.ALL_GATHER, (r,), "float32", (4,), attrs_of(dim=0))
    b.add(Op.ADD, (g, z), "float32", (4,))
    graph = b.build({"t": b.next_id - 1})
    assert [n.op for n in _comm_early(graph)] == [Op.INPUT, Op.EXP, Op.ALL_REDUCE, Op.ALL_GATHER, Op.NEG, Op.ADD]
