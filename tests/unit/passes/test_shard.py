"""The sharding pass: layouts, inserted collectives and their bytes, the single-process identity,
and its compile-time errors (rustc-style)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.ir.graph import Op
from xgbuild.compiler.ir.layout import infer_layouts
from xgbuild.compiler.ir.verify import verify
from xgbuild.compiler.ir.planner import ShardingError
from xgbuild.compiler.passes.shard import footprint, plan_of, shard
from xgbuild.errors import CompileError
from xgbuild.hw import load_profile

HEAD = "NUM_GPU = {n}\nextern Tensor[float32, 8, 16] A\nextern Tensor[float32, 16, 8] B\n"


def plan(body: str, n: int = 2, head: str = HEAD):
    c = compile_source(head.format(n=n) + "def main() {\n" + body + "}\n", "t.xg", verify_each=True)
    g = c.optimized.main
    verify(g)
    return c, g, plan_of(g, n)


def ops(g, *which):
    return [nd for nd in g.nodes if nd.op in which]


def test_row_sharded_matmul_stays_sharded_to_the_output() -> None:
    _, g, p = plan("    with shard(A, dim=0):\n        C = A @ B\n    return C\n")
    assert p["outputs"] == ["S(0)"]
    assert [c["op"] for c in p["collectives"]] == ["shard"] and p["bytes_moved"] == 0


def test_column_sharded_matmul() -> None:
    _, g, p = plan("    with shard(B, dim=1):\n        C = A @ B\n    return C\n")
    assert p["outputs"] == ["S(1)"]


def test_contracting_dim_gives_partial_sums_and_one_all_reduce() -> None:
    _, g, p = plan("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n    return C\n")
    (mm,) = ops(g, Op.MATMUL)
    assert str(infer_layouts(g, 2)[mm.id]) == "P(sum)"
    (ar,) = ops(g, Op.ALL_REDUCE)
    assert ar.inputs == (mm.id,) and p["outputs"] == ["R"]
    # a ring all-reduce sends 2 (n-1)/n of the 8x8 float32 result per GPU
    assert [c["bytes"] for c in p["collectives"] if c["op"] == "all_reduce"] == [2 * 256 * 1 // 2]


def test_reduce_scatter_and_all_to_all_where_a_consumer_wants_another_split() -> None:
    body = ("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n"
            "    with shard(C, dim=0):\n        D = relu(C)\n"
            "    with shard(D, dim=1):\n        E = D * 2.0\n    return E\n")
    _, g, p = plan(body, n=4)
    kinds = [c["op"] for c in p["collectives"]]
    assert "reduce_scatter" in kinds and "all_to_all" in kinds and "all_reduce" not in kinds
    assert p["outputs"] == ["S(1)"]


def test_partial_sums_reduced_anyway_combine_whole() -> None:
    # C and D are outputs, so each is all-reduced anyway: C + D adds the whole values (no third
    # reduction); a partial sum read by nothing whole stays partial through an add (one reduction).
    body = ("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n        D = A @ (B * 2.0)\n"
            "    return (C, D, C + D)\n")
    _, g, p = plan(body)
    assert [c["op"] for c in p["collectives"] if c["op"] != "shard"] == ["all_reduce", "all_reduce"]
    (add,) = ops(g, Op.ADD)
    assert {g.node(i).op for i in add.inputs} == {Op.ALL_REDUCE} and p["outputs"] == ["R", "R", "R"]
    _, g, p = plan("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n        D = A @ (B * 2.0)\n"
                   "    return C + D\n")
    (ar,) = ops(g, Op.ALL_REDUCE)
    assert g.node(ar.inputs[0]).op is Op.ADD
    # Not an output: C * 2.0 stays partial (made whole from C's free all-reduce, it would make D
    # pay a reduce-scatter to meet it); the chain ends in one scalar all-reduce.
    for head, want in (("", ["all_reduce", "all_reduce"]), ("        R1 = relu(C)\n", ["reduce_scatter", "all_reduce"])):
        out = "(R1, " if head else "(C, "
        _, g, p = plan("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n        D = A @ (B * 2.0)\n"
                       + head + f"    return {out}sum(C * 2.0 + D))\n")
        assert [c["op"] for c in p["collectives"] if c["op"] != "shard"] == want
    # X, an output, made whole from C's free all-reduce would make G, H and K each pay a
    # reduce-scatter to meet it: X stays partial (one all-reduce of it, three scalar ones).
    _, g, p = plan("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n        G = A @ (B * 3.0)\n"
                   "        H = A @ (B * 4.0)\n        K = A @ (B * 5.0)\n    X = C * 2.0\n"
                   "    return (C, X, sum(X + G), sum(X + H), sum(X + K))\n")
    moved = [c for c in p["collectives"] if c["op"] != "shard"]
    assert [c["op"] for c in moved] == ["all_reduce"] * 5 and sum(c["bytes"] for c in moved) == 2 * 256 + 3 * 4


def test_the_plan_kept_moves_the_fewest_bytes_of_the_ways_tried() -> None:
    from xgbuild.compiler.ir.planner import Planner
    from xgbuild.compiler.passes.shard import _traffic, best_plan
    c, _, _ = plan("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n        D = A @ (B * 2.0)\n"
                   "    return (C, D, C + D)\n")
    g = c.optimized.main
    raw = compile_source(HEAD.format(n=2) + "def main() {\n    with shard(A, dim=1), shard(B, dim=0):\n"
                         "        C = A @ B\n        D = A @ (B * 2.0)\n    return (C, D, C + D)\n}\n", "t.xg",
                         stop_after="stage").optimized.main      # before the sharding pass
    ways = [_traffic(Planner(raw, 2, free=f, leave=l).run(), 2) for f, l in
            ((False, "never"), (True, "outputs"), (True, "anywhere"))]
    assert _traffic(best_plan(raw, 2), 2) == min(ways) < ways[0]
    assert _traffic(g, 2) == min(ways)


def test_mean_over_a_split_dim_is_a_scaled_partial_sum() -> None:
    _, g, p = plan("    with shard(A, dim=0):\n        m = mean(A * A)\n    return m\n")
    assert not ops(g, Op.MEAN) and len(ops(g, Op.SUM)) == 1
    assert [c["op"] for c in p["collectives"]] == ["shard", "all_reduce"]


def test_conflicting_operands_gather_the_cheaper_one() -> None:
    # The seed's cluster_matmul: A by rows and B by columns cannot both stay split in one matmul.
    _, g, p = plan("    with shard(A, dim=0), shard(B, dim=1):\n        C = A @ B\n    return C\n")
    (ag,) = ops(g, Op.ALL_GATHER)
    assert p["outputs"] in (["S(0)"], ["S(1)"]) and ag.attr("dim") in (0, 1)


def test_parameters_stay_replicated_and_one_gpu_has_no_plan() -> None:
    _, g, p = plan("    C = A @ B\n    return C\n")
    assert not p["collectives"] and p["outputs"] == ["R"]
    _, g1, _ = plan("    with shard(A, dim=0):\n        C = A @ B\n    return C\n", n=1)
    assert not ops(g1, Op.SHARD)


def test_single_process_run_of_a_sharded_engine_matches_float64() -> None:
    body = ("    with shard(A, dim=1), shard(B, dim=0):\n        C = A @ B\n"
            "    with shard(C, dim=0):\n        D = relu(C)\n    return (D, mean(D))\n")
    c = compile_source(HEAD.format(n=4) + "def main() {\n" + body + "}\n", "t.xg")
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    d, m = engine_of(c).run({"A": a, "B": b}).value
    ref = torch.relu(a.double() @ b.double())
    assert ((d.double() - ref).norm() / ref.norm()) < 1e-6
    assert abs(m - ref.mean().item()) < 1e-5 * max(1.0, abs(ref.mean().item()))


def test_footprint_counts_each_gpus_share() -> None:
    _, g, _ = plan("    with shard(A, dim=0):\n        C = A @ B\n    return C\n")
    fp = footprint(g, 2)
    assert fp["inputs"] == 8 * 16 * 4 // 2 + 16 * 8 * 4      # each GPU loads only its half of A
    assert fp["activations"] >= 4 * 8 * 4                # C's half


BIG = "TARGET_GPU = H100\nNUM_GPU = {n}\nextern Tensor[float32, 160000, 160000] W\n"


def test_a_plan_larger_than_hbm_is_rejected_rustc_style() -> None:
    with pytest.raises(CompileError) as err:
        compile_source(BIG.format(n=1) + "def main() {\n    return W * 2.0\n}\n", "big.xg")
    text = str(err.value)
    assert text.startswith("error[XG0504]: the one GPU needs")
    assert err.value.diagnostics[-1].code == "XG0504"        # also in `--json`
    assert "H100" in text and "= help:" in text and "`W`" in text


def test_sharding_the_big_input_makes_it_fit() -> None:
    src = BIG.format(n=8) + "def main() {\n    with shard(W, dim=0):\n        Y = W * 2.0\n    return Y\n}\n"
    compile_source(src, "big.xg")        # 102 GB whole: one H100 cannot hold it, 8 can (12.8 GB each + Y)


def test_num_gpu_override_replans() -> None:
    src = HEAD.format(n=2) + "def main() {\n    with shard(A, dim=0):\n        C = A @ B\n    return C\n}\n"
    c = compile_source(src, "t.xg", CheckOptions(num_gpu=4))
    assert plan_of(c.optimized.main, 4)["num_gpu"] == 4


# --- the memory check reads the profile the Program carries (a custom hw directory included) -----
SMALL = "TARGET_GPU = H100\nNUM_GPU = 1\nextern Tensor[float32, 16000, 16000] W\ndef main() {\n    return W * 2.0\n}\n"


def test_the_memory_check_uses_the_custom_hw_dirs_profile(small_h100_hw_dir) -> None:
    compile_source(SMALL, "small.xg")                    # 2 GB: fits the built-in H100's 80 GB
    custom = small_h100_hw_dir
    with pytest.raises(CompileError) as err:
        compile_source(SMALL, "small.xg", CheckOptions(hw_dir=custom))
    assert err.value.diagnostics[-1].code == "XG0504" and "1.0 GB" in str(err.value)


def test_the_default_target_comes_from_the_custom_hw_dir_too(small_h100_hw_dir) -> None:
    src = SMALL.replace("TARGET_GPU = H100\n", "")
    compile_source(src, "small.xg")
    with pytest.raises(CompileError) as err:
        compile_source(src, "small.xg", CheckOptions(hw_dir=small_h100_hw_dir))
    assert err.value.diagnostics[-1].code == "XG0504"


def test_programs_carry_the_checkers_profile_outside_their_identity(small_h100_hw_dir) -> None:
    custom = small_h100_hw_dir
    c = compile_source(SMALL.replace("W * 2.0", "W[0:1, 0:1]").replace("16000, 16000", "8, 8"), "s.xg",
                       CheckOptions(hw_dir=custom))
    small = load_profile("H100", custom)
    assert c.typed.profile is small and c.lowered.profile is small and c.optimized.profile is small
    assert c.lowered.target == "H100"
    bare = replace(c.lowered, profile=None)
    assert bare == c.lowered and "profile" not in repr(c.lowered)


def test_a_program_built_without_a_profile_gets_the_built_in_one(small_h100_hw_dir) -> None:
    lowered = compile_source(SMALL, "small.xg", stop_after="inline").lowered
    shard(replace(lowered, profile=None))                # the built-in H100: fits
    with pytest.raises(ShardingError):
        shard(replace(lowered, profile=load_profile("H100", small_h100_hw_dir)))
