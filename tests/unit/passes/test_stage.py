"""Pipeline stages: placement from a plan's regions, gradients placed with their nodes, the
transfers every rank agrees on, per-GPU memory, and every rank's part run in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.shard_plan import load_plan
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.ir.stages import infer_stages, stage_plan
from xgbuild.compiler.passes.shard import footprint, plan_lines, plan_of
from xgbuild.errors import CompileError
from xgbuild.runtime.cpu import CpuExecutor

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = REPO_ROOT / "examples" / "pipeline.xg"


def compiled(plan: Path, src: Path = EXAMPLE, num_gpu: int | None = None):
    return compile_file(src, CheckOptions(num_gpu=num_gpu), plan=load_plan(plan))


def train_values(engine_graph) -> dict[str, torch.Tensor]:
    """A valid training-step input (second moments positive), fresh random, float64."""
    gen = torch.Generator().manual_seed(11)
    out = {}
    for name, nid in engine_graph.inputs:
        n = engine_graph.node(nid)
        shape = tuple(n.shape)
        if n.dtype == "int64":
            out[name] = torch.randint(0, 16, shape, generator=gen)
        elif name in ("STEP", "LR"):
            out[name] = torch.tensor(3.0 if name == "STEP" else 0.01, dtype=torch.float64)
        elif name.startswith("V_"):
            out[name] = torch.rand(shape, generator=gen, dtype=torch.float64) * 1e-3 + 1e-3
        else:
            out[name] = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1
    return out


def test_each_layer_runs_on_its_gpu_and_its_gradient_with_it() -> None:
    g = compiled(REPO_ROOT / "examples" / "pipeline.toml").optimized.main
    st = infer_stages(g)
    mm = [n for n in g.nodes if n.op is Op.MATMUL]
    fwd1 = next(n for n in mm if n.shape == (64, 16) and g.node(n.inputs[1]).shape == (32, 16))
    fwd2 = next(n for n in mm if n.shape == (64, 8))
    dw1 = next(n for n in mm if n.shape == (32, 16))
    dw2 = next(n for n in mm if n.shape == (16, 8))
    assert (st[fwd1.id], st[dw1.id]) == (0, 0) and (st[fwd2.id], st[dw2.id]) == (1, 1)
    loss, w1, w2 = tree_ids(g.output)
    assert (st[loss], st[w1], st[w2]) == (1, 0, 1)       # each GPU updates the weights it used
    assert all(st[i] is None for _, i in g.inputs)          # inputs are read where they are used
    # Only placed STAGE nodes are left (autodiff's markers are resolved or dropped).
    assert all(n.attr("stage") in (0, 1) and len(n.inputs) == 1 for n in g.nodes if n.op is Op.STAGE)


def test_ranks_agree_on_the_order_of_their_transfers() -> None:
    g = compiled(REPO_ROOT / "models" / "plans" / "train_pipeline4.toml", REPO_ROOT / "models" / "train.xg",
                 num_gpu=4).optimized.main
    plans = [stage_plan(g, r, 4) for r in range(4)]
    for a in range(4):
        for b, seq in plans[a].pairs.items():
            assert seq == plans[b].pairs[a]             # the same list on both sides: sends meet receives
            assert [t.seq for t in seq] == list(range(len(seq)))
    pos = {n.id: k for k, n in enumerate(g.nodes)}
    for p in plans:                                     # a rank runs its nodes in graph order
        assert [pos[i] for i in p.run] == sorted(pos[i] for i in p.run)
        assert not set(p.run) & set(p.recv)
    assert all(tree_ids(g.output)[k] in set(plans[0].run) | set(plans[0].recv) for k in range(len(tree_ids(g.output))))


def test_every_rank_run_in_one_process_gives_the_whole_programs_result() -> None:
    # Each rank's part, run in turn with transfers copied between them, equals one process's run.
    c = compiled(REPO_ROOT / "models" / "plans" / "train_pipeline.toml", REPO_ROOT / "models" / "train.xg", 2)
    g = c.optimized.main
    inputs = train_values(g)
    ex = CpuExecutor(float64=True, check=False, timings=False)
    whole: dict[int, torch.Tensor] = {}
    for n in g.nodes:
        whole[n.id] = ex.eval(n, [whole[i] for i in n.inputs], inputs)
    got: dict[int, dict[int, torch.Tensor]] = {0: {}, 1: {}}
    plans = [stage_plan(g, r, 2) for r in range(2)]
    pending = {r: list(plans[r].run) for r in range(2)}
    while any(pending.values()):           # run whatever is ready on each rank: no deadlock
        progressed = False
        for r in range(2):
            while pending[r]:
                n = g.node(pending[r][0])
                if any(i not in got[r] and i in plans[r].recv and i not in got[1 - r] for i in n.inputs):
                    break
                args = [got[r][i] if i in got[r] else got[1 - r][i] for i in n.inputs]
                got[r][n.id] = ex.eval(n, args, inputs)
                pending[r].pop(0)
                progressed = True
        assert progressed
    for i in tree_ids(g.output):
        value = got[0].get(i, got[1].get(i))
        assert torch.equal(value, whole[i])


def test_each_gpu_holds_only_its_stage() -> None:
    c = compiled(REPO_ROOT / "models" / "plans" / "train_pipeline.toml", REPO_ROOT / "models" / "train.xg", 2)
    fp = footprint(c.optimized.main, 2)
    one = footprint(compile_file(REPO_ROOT / "models" / "train.xg").optimized.main, 1)
    assert len(fp["per_stage"]) == 2 and fp["total"] == max(s["total"] for s in fp["per_stage"])
    assert all(s["activations"] < one["activations"] for s in fp["per_stage"])
    text = "\n".join(plan_lines(plan_of(c.optimized.main, 2, "H100")))
    assert text.startswith("pipeline plan over 2 GPUs") and "send GPU 1 -> GPU 0" in text


def test_a_pipeline_beside_a_split_in_the_source_is_rejected(tmp_path: Path) -> None:
    src = EXAMPLE.read_text().replace("    (l, grads) =", "    with shard(X, dim=0):\n        z = X * 2.0\n    (l, grads) =")
    src = src.replace("return (l, W1", "return (l, z, W1")
    path = tmp_path / "p.xg"
    path.write_text(src)
    with pytest.raises(CompileError) as err:
        compiled(REPO_ROOT / "examples" / "pipeline.toml", path)
    assert str(err.value).startswith("error[XG0507]") and "the program shards `X`" in str(err.value)


def test_one_gpu_drops_the_stages() -> None:
    g = compiled(_one_stage_plan(), num_gpu=1).optimized.main
    assert not any(n.op is Op.STAGE for n in g.nodes)


def _one_stage_plan() -> Path:
    import tempfile
    path = Path(tempfile.mkdtemp()) / "one.toml"
    path.write_text("[regions.layer1]\nstage = 0\n[regions.layer2]\nstage = 0\n")
    return path
