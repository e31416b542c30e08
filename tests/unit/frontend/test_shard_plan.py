"""Sharding plan files: strategies by region, function or input name, and every way one is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.frontend.shard_plan import load_plan
from xgbuild.compiler.ir.graph import Op
from xgbuild.compiler.ir.layout import infer_layouts
from xgbuild.compiler.passes.shard import plan_lines, plan_of
from xgbuild.errors import CompileError

PROG = """NUM_GPU = 2
extern Tensor[float32, 8, 16] X
extern Tensor[float32, 16, 32] W1
extern Tensor[float32, 32, 16] W2
def mlp(Tensor[float32, T, D] x, Tensor[float32, D, F] w1, Tensor[float32, F, D] w2) -> Tensor[float32, T, D] {
    return gelu(x @ w1) @ w2
}
def main() {
    with shard("layer1"):
        h = relu(X @ W1)
    return (h, mlp(X, W1, W2))
}
"""


def compiled(tmp_path: Path, plan_text: str, prog: str = PROG):
    path = tmp_path / "plan.toml"
    path.write_text(plan_text)
    c = compile_source(prog, "prog.xg", plan=load_plan(path))
    return c, plan_of(c.optimized.main, c.num_gpu)


def error(tmp_path: Path, plan_text: str, prog: str = PROG) -> str:
    with pytest.raises(CompileError) as err:
        compiled(tmp_path, plan_text, prog)
    return str(err.value)


def test_data_region_splits_what_the_block_reads_except_the_replicated(tmp_path: Path) -> None:
    c, plan = compiled(tmp_path, '[regions.layer1]\nstrategy = "data"\nreplicated = ["W1"]\n')
    g = c.optimized.main
    (mm,) = [n for n in g.nodes if n.op is Op.MATMUL and n.shape == (8, 32)]
    assert str(infer_layouts(g, 2)[mm.id]) == "S(0)"
    assert plan["outputs"][0] == "S(0)"


def test_tensor_strategy_on_a_function_gives_partial_sums(tmp_path: Path) -> None:
    c, plan = compiled(tmp_path, '[regions.mlp]\nstrategy = "tensor"\nshard = { w1 = 1, w2 = 0 }\n')
    assert "all_reduce" in [k["op"] for k in plan["collectives"]] and plan["outputs"][1] == "R"


def test_values_and_num_gpu(tmp_path: Path) -> None:
    c, plan = compiled(tmp_path, 'num_gpu = 4\n[values]\nX = 0\nW2 = "replicated"\n')
    assert c.num_gpu == 4 and plan["num_gpu"] == 4 and plan["outputs"][0] == "S(0)"


def test_the_plan_is_kept_in_the_engine(tmp_path: Path) -> None:
    from xgbuild.build.package import engine_of
    c, _ = compiled(tmp_path, '[values]\nX = 0\n')
    m = engine_of(c).manifest
    assert any(s["path"] == "sources/plan.toml" for s in m["sources"]) and m["sharding_plan"]["num_gpu"] == 2


DP = "[regions.layer1]\n"                      # then a pipeline key for it
SPLIT = "[pipeline]\nsplit = { X = 0 }\n"


@pytest.mark.parametrize("text,code,words", [
    ('[regions.layer2]\nstrategy = "data"\n', "XG0505", "`layer2`, which is neither"),
    ('[regions.mlp]\nstrategy = "tensor"\nshard = { w3 = 1 }\n', "XG0505", "no parameter `w3`"),
    ('[values]\nY = 0\n', "XG0505", "`Y`, which is not an input"),
    ('num_gpu = 3\n[values]\nW2 = 1\n', "XG0500", "dimension 1 of `W2` has size 16"),
    ('[regions.layer1]\nstrategy = "pipeline"\n', "XG0506", "needs `stage = K`"),
    ('[regions.layer1]\nstrategy = "data"\nworkers = [0, 1]\n', "XG0507", "also names GPUs"),
    ('[regions.layer1]\nworkers = [0, 1]\n', "XG0506", "runs on 2 GPUs, which split the batch"),
    ('[regions.layer1]\nstage = 2\n', "XG0506", "placed on stage 2, but the engine has 2 GPUs"),
    ('[regions.layer1]\nstage = 0\nworkers = [0]\n', "XG0506", "both `stage` and `workers`"),
    ('[regions.layer1]\nstage = -1\n', "XG0506", "needs `stage = K`"),
    ('[regions.layer1]\nstage = 1\naxis = 0\n', "XG0506", "`axis` does not apply to strategy \"pipeline\""),
    ('[regions.layer1]\nstage = 1\n[regions.mlp]\nstrategy = "tensor"\nshard = { w1 = 1 }\n', "XG0507",
     "pipeline stages with data or tensor parallelism"),
    ('[regions.layer1]\nstage = 1\n[values]\nX = 0\n', "XG0507", "`[values]` splits `X`"),
    ('[pipeline]\nmicrobatches = 2\nsplit = { X = 0 }\n', "XG0506", "microbatches need pipeline regions"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 0\nsplit = { X = 0 }\n', "XG0506",
     "`microbatches` must be a positive integer"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 2\n', "XG0506", "`split` names no input"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 2\nsplit = { Z = 0 }\n', "XG0505",
     "splits `Z` into microbatches"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 3\nsplit = { X = 0 }\n', "XG0506",
     "3 microbatches do not divide"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 2\nsplit = { X = 2 }\n', "XG0506",
     "has 2 dimensions"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 2\nsplit = { X = 0 }\nsched = 1\n', "XG0506",
     "unknown key `sched`"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nmicrobatches = 2\nsplit = { X = 0 }\nschedule = "zb"\n', "XG0506",
     "`schedule` is 'zb'"),
    ('[regions.layer1]\nstage = 1\n[pipeline]\nschedule = "gpipe"\n', "XG0506", "the plan has none"),
    (f'num_gpu = 4\n{DP}workers = [0, 1]\n[regions.mlp]\nworkers = [1, 2]\n{SPLIT}', "XG0506",
     "GPU 1 is in two different stages"),
    (f'num_gpu = 3\n{DP}workers = [0]\n[regions.mlp]\nworkers = [1, 2]\n{SPLIT}', "XG0506", "stages of different sizes"),
    (f'num_gpu = 6\n{DP}workers = [0, 1]\n[regions.mlp]\nworkers = [2, 3]\n{SPLIT}', "XG0506",
     "GPU 4 is in no stage's `workers`"),
    (f'{DP}workers = [0, 2]\n', "XG0506", "runs on GPU 2, but the engine has 2"),
    (f'{DP}workers = [1, 1]\n', "XG0506", "lists a GPU twice"),
    (f'num_gpu = 4\n{DP}stage = 0\n[regions.mlp]\nworkers = [2, 3]\n', "XG0506", "others several `workers`"),
    (f'num_gpu = 4\n{DP}stage = 0\n[regions.mlp]\nworkers = [1]\n{SPLIT}', "XG0506",
     "puts a region on one GPU, but 4 GPUs over 2 stages give each stage 2"),
    (f'{DP}stage = 0\n[regions.mlp]\nworkers = [5]\n', "XG0506", "region `mlp` runs on GPU 5, but the engine has 2"),
    (f'num_gpu = 3\n{DP}stage = 0\n[regions.mlp]\nstage = 1\n', "XG0506", "3 GPUs do not split evenly over 2 stages"),
    (f'num_gpu = 4\n{DP}stage = 0\n[regions.mlp]\nstage = 1\n', "XG0506",
     "each of the 2 stages runs on 2 GPUs, which split the batch"),
    (f'num_gpu = 4\n{DP}stage = 0\n[regions.mlp]\nstage = 1\n[pipeline]\nmicrobatches = 8\nsplit = {{ X = 0 }}\n',
     "XG0506", "which 8 microbatches x 2 GPUs per stage (16 pieces) do not divide"),
    ('[regions.layer1]\nstrategy = "fast"\n', "XG0506", "strategy 'fast'"),
    ('[regions.layer1]\nstrategy = "tensor"\n', "XG0506", "splits nothing"),
    ('[regions.layer1]\nstrategy = "replicated"\naxis = 1\n', "XG0506", "`axis` does not apply"),
    ('layers = 3\n', "XG0506", "unknown key `layers`"),
    ('[values\n', "XG0506", "not TOML"),
], ids=["region", "param", "value", "indivisible", "pipeline-no-stage", "data-workers", "stage-of-2-gpus",
        "stage-too-high", "stage-and-workers", "negative-stage", "pipeline-key", "pipeline-and-tensor",
        "pipeline-and-split", "micro-no-regions", "micro-zero", "micro-no-split",
        "micro-unknown-input", "micro-indivisible", "micro-dim", "micro-key", "micro-schedule", "schedule-no-micro",
        "workers-overlap", "workers-sizes", "workers-idle-gpu", "workers-gpu-too-high", "workers-twice",
        "stage-beside-workers", "one-gpu-workers-in-stages-of-2", "one-gpu-workers-too-high", "uneven-stages", "dp-no-split", "dp-indivisible",
        "strategy", "tensor-empty", "key", "top-key", "toml"])
def test_bad_plans_are_rejected_with_a_code(tmp_path: Path, text: str, code: str, words: str) -> None:
    msg = error(tmp_path, text)
    assert msg.startswith(f"error[{code}]") and words in msg and "plan.toml" in msg, msg
    with pytest.raises(CompileError) as err:
        compiled(tmp_path, text)
    assert [d.code for d in err.value.diagnostics if d.severity.value == "error"] == [code]   # for --json


def test_stages_of_several_gpus_are_numbered_by_their_first_gpu(tmp_path: Path) -> None:
    from xgbuild.compiler.ir.stages import batch_split, infer_stages, stage_gpus, stage_of
    c, plan = compiled(tmp_path, f'num_gpu = 4\n{DP}workers = [3, 2]\n[regions.mlp]\nworkers = [0, 1]\n'
                                 '[pipeline]\nsplit = { X = 0 }\n')
    g = c.optimized.main
    assert stage_gpus(g) == ((0, 1), (2, 3)) and stage_of(g, 3) == (1, 1) and stage_of(g, 0) == (0, 0)
    assert all(n.attr("gpus") == ((0, 1), (2, 3)) for n in g.nodes if n.op is Op.STAGE)
    st = infer_stages(g)
    (h,) = [n for n in g.nodes if n.op is Op.RELU]
    assert st[h.id] == 1                                   # layer1 runs on the stage of GPUs 2 and 3
    assert batch_split(g) == {"X": 0}
    pp = plan["pipeline"]
    assert pp["gpus"] == [[0, 1], [2, 3]] and pp["replicas"] == 2 and pp["microbatches"] == 1
    # No training here: only the outputs combine the replicas' halves (gathered inside each stage).
    assert {c["op"] for c in pp["collectives"]} == {"all_gather"}


def test_stage_numbers_give_each_stage_num_gpu_over_stages_gpus(tmp_path: Path) -> None:
    from xgbuild.compiler.ir.stages import stage_gpus
    c, plan = compiled(tmp_path, f'num_gpu = 4\n{DP}stage = 1\n[regions.mlp]\nstage = 0\n'
                                 '[pipeline]\nmicrobatches = 2\nsplit = { X = 0 }\n')
    assert stage_gpus(c.optimized.main) == ((0, 1), (2, 3))
    text = "\n".join(plan_lines(plan))
    assert "2 stages of 2 GPUs, [0, 1], [2, 3]: 2 data-parallel replicas" in text
    assert "over the 2 GPUs of stage" in text and "send stage 1 -> stage 0" in text


def test_one_plan_serves_stages_of_one_gpu_or_several(tmp_path: Path) -> None:
    # A data-parallel pipeline plan (its batch named, no microbatches) on NUM_GPU = stages: the
    # split has nothing to cut and is ignored; GT2's one-GPU `workers` lists may leave a GPU idle.
    from xgbuild.compiler.ir.stages import stage_gpus
    text = f'{DP}stage = 0\n[regions.mlp]\nstage = 1\n{SPLIT}'
    for n, gpus in ((2, ((0,), (1,))), (4, ((0, 1), (2, 3)))):
        c, _ = compiled(tmp_path, f"num_gpu = {n}\n" + text)
        g = c.optimized.main
        assert stage_gpus(g) == gpus and any(x.op is Op.MICROBATCH for x in g.nodes) == (n == 4)
    c, _ = compiled(tmp_path, f'num_gpu = 3\n{DP}workers = [0]\n[regions.mlp]\nworkers = [2]\n')
    assert stage_gpus(c.optimized.main) == ((0,), (1,), (2,))


def test_a_plan_contradicting_the_source_is_a_conflict(tmp_path: Path) -> None:
    prog = PROG.replace("    return (h, mlp(X, W1, W2))", "    with shard(X, dim=1):\n        y = X * 2.0\n    return (h, y)")
    msg = error(tmp_path, "[values]\nX = 0\n", prog)
    assert msg.startswith("error[XG0503]: `X` is sharded along dimension 1 and along dimension 0"), msg


def test_a_split_that_no_gpu_count_divides_after_inlining_is_a_pass_error(tmp_path: Path) -> None:
    prog = PROG.replace("Tensor[float32, 8, 16] X", "Tensor[float32, 7, 16] X")
    msg = error(tmp_path, '[regions.mlp]\nstrategy = "data"\n', prog)
    assert msg.startswith("error[XG0500]: dimension 0 of") and "= help:" in msg, msg


def test_a_block_region_must_read_the_names_its_plan_splits(tmp_path: Path) -> None:
    msg = error(tmp_path, '[regions.layer1]\nstrategy = "tensor"\nshard = { W2 = 0 }\n')
    assert msg.startswith("error[XG0505]: region `layer1` does not read `W2`") and "`X`, `W1`" in msg, msg


def test_a_replicated_region_gathers_what_it_reads(tmp_path: Path) -> None:
    prog = PROG.replace('    with shard("layer1"):\n        h = relu(X @ W1)',
                        '    with shard(X, dim=0):\n        g = X * 2.0\n    with shard("layer1"):\n        h = relu(g @ W1)')
    c, plan = compiled(tmp_path, '[regions.layer1]\nstrategy = "replicated"\n', prog)
    assert "all_gather" in [k["op"] for k in plan["collectives"]] and plan["outputs"][0] == "R"
