"""Pipeline stages: placement from a plan's regions, gradients placed with their nodes, the
transfers every rank agrees on, per-GPU memory, and every rank's part run in one process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.shard_plan import load_plan
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.ir.stages import infer_stages, stage_gpus, stage_plan, stage_plans
from xgbuild.compiler.passes.shard import footprint, plan_lines, plan_of
from xgbuild.compiler.passes.stage import stage_footprint
from xgbuild.errors import CompileError
from xgbuild.hw import load_profile
from xgbuild.runtime import spmd
from xgbuild.runtime.cpu import CpuExecutor
from xgbuild.runtime.spmd import Group, SpmdExecutor

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = REPO_ROOT / "examples" / "pipeline.xg"


def compiled(plan: Path, src: Path = EXAMPLE, num_gpu: int | None = None):
    return compile_file(src, CheckOptions(num_gpu=num_gpu), plan=load_plan(plan))


def train_values(engine_graph) -> dict[str, torch.Tensor]:
    """A valid training-step input (second moments positive), fresh random, float64."""
    seed = time.time_ns() % 2**62
    print(f"training inputs drawn with seed {seed}")       # shown by pytest when a test fails
    gen = torch.Generator().manual_seed(seed)
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
    g = compiled(REPO_ROOT / "models" / "plans" / "train_pipeline4.toml", REPO_ROOT / "models" / "train_tiny.xg",
                 num_gpu=4).optimized.main
    plans = [stage_plan(g, r) for r in range(4)]
    for a in range(4):
        for b, seq in plans[a].pairs.items():
            assert seq == plans[b].pairs[a]             # the same list on both sides: sends meet receives
            assert [t.seq for t in seq] == list(range(len(seq)))
    pos = {n.id: k for k, n in enumerate(g.nodes)}
    for p in plans:                                     # a rank runs its nodes in graph order
        run = [i for i, _ in p.tasks]
        assert [pos[i] for i in run] == sorted(pos[i] for i in run)
        assert not set(p.tasks) & set(p.recv)
    assert all((i, None) in set(plans[0].tasks) | set(plans[0].recv) for i in tree_ids(g.output))


def run_ranks_in_turn(g, world: int, inputs: dict) -> dict[int, torch.Tensor]:
    """Every rank's tasks run in one process, each rank going as far as the values it has received
    allow (a value is there once its sender computed it), with combinations over microbatches done
    as the runtime does; returns rank 0's outputs by the engine graph's output ids."""
    from xgbuild.runtime.spmd import Group, SpmdExecutor
    ex = SpmdExecutor(Group(0, world), float64=True, check=False)
    plans = stage_plans(g)
    mg = plans[0].graph
    vals: list[dict] = [{} for _ in range(world)]
    idx = [0] * world
    while any(idx[r] < len(plans[r].tasks) for r in range(world)):
        progressed = False
        for r, plan in enumerate(plans):
            while idx[r] < len(plan.tasks):
                nid, m = plan.tasks[idx[r]]
                reads = plan.needs(nid, m)
                have = [vals[r].get(k) if k not in plan.recv else vals[plan.recv[k].src].get(k) for k in reads]
                if any(v is None for v in have):
                    break
                vals[r][(nid, m)] = ex._task(mg.node(nid), m, plan.parts, have, inputs)
                idx[r] += 1
                progressed = True
        assert progressed, "the ranks' tasks wait on each other"
    out = {}
    for orig, i in zip(tree_ids(g.output), tree_ids(mg.output)):
        key = (i, None)
        out[orig] = vals[0][key] if key not in plans[0].recv else vals[plans[0].recv[key].src][key]
    return out


def assert_ranks_match_one_process(g, world: int = 2) -> None:
    """Fresh random float64 inputs: every rank's tasks, run in turn, give one process's outputs."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(time.time_ns() % 2**63)))
    gen = torch.Generator().manual_seed(seed)
    inputs = {name: torch.randn(tuple(g.node(nid).shape), generator=gen, dtype=torch.float64)
              for name, nid in g.inputs}
    got, want = run_ranks_in_turn(g, world, inputs), whole_run(g, inputs)
    for i, w in want.items():
        assert float((got[i] - w).norm() / w.norm()) < 1e-12, f"output %{i} (seed {seed})"


def whole_run(g, inputs: dict) -> dict[int, torch.Tensor]:
    ex = CpuExecutor(float64=True, check=False, timings=False)
    whole: dict[int, torch.Tensor] = {}
    for n in g.nodes:
        whole[n.id] = ex.eval(n, [whole[i] for i in n.inputs], inputs)
    return {i: whole[i] for i in tree_ids(g.output)}


@pytest.mark.parametrize("plan,world,micro", [("train_pipeline", 2, 1), ("train_pipeline4", 4, 1),
                                              ("train_pipeline", 2, 4), ("train_pipeline4", 4, 2)])
def test_every_rank_run_in_turn_gives_the_whole_programs_result(tmp_path: Path, plan: str, world: int,
                                                                micro: int) -> None:
    text = (REPO_ROOT / "models" / "plans" / f"{plan}.toml").read_text().split("[pipeline]")[0]
    if micro > 1:   # the model has no batch dim: its 32 tokens go in microbatches (attention gathers them)
        text += f"\n[pipeline]\nmicrobatches = {micro}\nsplit = {{ TOKENS = 0, TARGETS = 0 }}\n"
    (tmp_path / "p.toml").write_text(text)
    g = compiled(tmp_path / "p.toml", REPO_ROOT / "models" / "train_tiny.xg", world).optimized.main
    inputs = train_values(g)
    got, want = run_ranks_in_turn(g, world, inputs), whole_run(g, inputs)
    for i, w in want.items():
        err = float((got[i].double() - w).norm() / max(float(w.norm()), 1e-30))
        assert err < 1e-12 if micro == 1 else err < 1e-9, (i, err)


def _example(tmp_path: Path, schedule: str):
    text = (REPO_ROOT / "examples" / "pipeline.toml").read_text() + f'schedule = "{schedule}"\n'
    (tmp_path / "p.toml").write_text(text)
    return compiled(tmp_path / "p.toml").optimized.main


def _order(plan, ops=(Op.RELU, Op.WHERE)) -> list:
    mg = plan.graph
    return [("F" if mg.node(nid).op is Op.RELU else "B", m) for nid, m in plan.tasks if mg.node(nid).op in ops]


def test_gpipe_runs_every_forward_microbatch_then_the_backward_ones(tmp_path: Path) -> None:
    first, last = stage_plans(_example(tmp_path, "gpipe"))
    assert first.parts == 4
    assert _order(first) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("B", 1), ("B", 2), ("B", 3)]
    # The activations go over one microbatch at a time, and so do their gradients.
    assert [t.mb for t in first.pairs[1] if t.src == 0] == [0, 1, 2, 3]
    assert [t.mb for t in first.pairs[1] if t.src == 1 and t.mb is not None] == [0, 1, 2, 3]
    mg = last.graph
    mm = [m for nid, m in last.tasks if mg.node(nid).op is Op.MATMUL]
    assert mm[:3] == [0, 0, 0]          # the last GPU: forward, then both backward products, per microbatch
    # Weight gradients add up over microbatches once.
    assert sum(1 for nid, m in last.tasks if mg.node(nid).op is Op.ALL_REDUCE) == 1


def test_1f1b_interleaves_after_one_warm_up_microbatch_per_gpu_downstream(tmp_path: Path) -> None:
    g = _example(tmp_path, "1f1b")
    first, _ = stage_plans(g)
    assert _order(first) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    # GPU 0 holds two microbatches' activations at most instead of four.
    one = stage_footprint(g)[0]["activations"]
    assert one < stage_footprint(_example(tmp_path, "gpipe"))[0]["activations"]
    assert_ranks_match_one_process(g)


def test_each_microbatchs_addend_goes_into_a_running_sum_at_once(tmp_path: Path) -> None:
    # The weight gradients' addends (one per microbatch) are summed as they are made and freed, so a
    # GPU holds one running sum, not M addends stacked at the end.
    from xgbuild.compiler.ir.stages import running_sums
    g = _example(tmp_path, "gpipe")
    plans = stage_plans(g)
    assert all(running_sums(p) for p in plans)
    for plan in plans:
        sums = running_sums(plan)
        for step in plan.steps():
            if step.into is not None:
                assert sums[step.node] == step.into and step.key in step.frees     # freed at once
            if step.summed is not None:
                assert not any(k[0] == step.summed for k in step.reads)
        assert {s.node for s in plan.steps() if s.summed is not None} == set(sums.values())
    assert_ranks_match_one_process(g)


def test_microbatches_equal_the_whole_batch() -> None:
    g = compiled(REPO_ROOT / "examples" / "pipeline.toml").optimized.main
    assert_ranks_match_one_process(g)


def test_each_gpu_holds_only_its_stage() -> None:
    c = compiled(REPO_ROOT / "models" / "plans" / "train_pipeline.toml", REPO_ROOT / "models" / "train_tiny.xg", 2)
    fp = footprint(c.optimized.main, 2)
    one = footprint(compile_file(REPO_ROOT / "models" / "train_tiny.xg").optimized.main, 1)
    assert len(fp["per_stage"]) == 2 and fp["total"] == max(s["total"] for s in fp["per_stage"])
    assert all(s["activations"] < one["activations"] for s in fp["per_stage"])
    text = "\n".join(plan_lines(plan_of(c.optimized.main, 2, load_profile("H100"))))
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


DEADLOCK = """NUM_GPU = 2
extern Tensor[float32, 8, 4] X
extern Tensor[float32, 4, 4] W1
extern Tensor[float32, 4, 4] W2
def fa(Tensor[float32, 8, 4] x, Tensor[float32, 4, 4] w) -> Tensor[float32, 8, 4] {
    return x @ w
}
def fb(Tensor[float32, 8, 4] x, Tensor[float32, 4, 4] w) -> Tensor[float32, 8, 4] {
    return x @ w
}
def fc(Tensor[float32, 8, 4] v) -> float32 {
    return exp(sum(v) * 0.01)
}
def fd(Tensor[float32, 8, 4] a) -> float32 {
    return exp(sum(a) * 0.01)
}
def main() {
    a = fa(X, W1)
    v = fb(X, W2)
    b = fc(v)
    c = fd(a)
    return (b, v * c)
}
"""


def test_orders_that_would_wait_on_each_other_are_rescheduled(tmp_path: Path) -> None:
    # GPU 0 makes `c` after `b`, which needs every microbatch of `v` from GPU 1; GPU 1 reads `c` for
    # microbatch 0 before it sends `v` for microbatch 1. Taken in the ranks' first orders, each would
    # wait on the other: the schedule moves ready work ahead instead.
    (tmp_path / "p.xg").write_text(DEADLOCK)
    (tmp_path / "p.toml").write_text("[regions.fa]\nstage = 0\n[regions.fb]\nstage = 1\n[regions.fc]\nstage = 0\n"
                                     "[regions.fd]\nstage = 0\n[pipeline]\nmicrobatches = 2\nsplit = { X = 0 }\n")
    g = compiled(tmp_path / "p.toml", tmp_path / "p.xg").optimized.main
    assert_ranks_match_one_process(g)


def test_each_rank_reads_only_the_inputs_of_its_stage() -> None:
    from xgbuild.compiler.ir.stages import stage_inputs
    g = compiled(REPO_ROOT / "examples" / "pipeline.toml").optimized.main
    assert stage_inputs(g, 0) == {"X", "W1"} and stage_inputs(g, 1) == {"Y", "W2"}


def test_a_symbolic_batch_the_microbatches_do_not_divide_is_an_input_error(tmp_path: Path) -> None:
    from xgbuild.compiler.passes.specialize import bind_symbols, specialize
    from xgbuild.errors import InputError
    from xgbuild.runtime.spmd import Group, SpmdExecutor
    (tmp_path / "p.xg").write_text(EXAMPLE.read_text().replace("Tensor[float32, 64, 32] X", "Tensor[float32, B, 32] X")
                                   .replace("Tensor[float32, 64, 8] Y", "Tensor[float32, B, 8] Y"))
    g = compiled(REPO_ROOT / "examples" / "pipeline.toml", tmp_path / "p.xg").optimized.main
    shapes = {"X": (6, 32), "Y": (6, 8), "W1": (32, 16), "W2": (16, 8)}
    sg = specialize(g, bind_symbols(g, shapes))
    with pytest.raises(InputError, match="size 6, which 4 microbatches do not divide"):
        SpmdExecutor(Group(0, 2))._run_stages(sg, {k: torch.zeros(v) for k, v in shapes.items()})


def test_1f1b_warm_up_is_one_microbatch_per_later_gpu(tmp_path: Path) -> None:
    # A 4-layer MLP, a layer per GPU, 8 microbatches: GPU k runs 4 - k forward microbatches before
    # its first backward one (the 1F1B warm-up), so it holds 4 - k microbatches' activations at most.
    import sys
    sys.path.insert(0, str(REPO_ROOT / "tools" / "bench"))
    from bench_multi_gpu import pipeline_source
    (tmp_path / "p.xg").write_text(pipeline_source(64, 16))
    (tmp_path / "p.toml").write_text("".join(f"[regions.layer{i}]\nstage = {i}\n" for i in range(4))
                                     + "[pipeline]\nmicrobatches = 8\nsplit = { X = 0, Y = 0 }\n")
    g = compile_file(tmp_path / "p.xg", CheckOptions(num_gpu=4), plan=load_plan(tmp_path / "p.toml")).optimized.main
    plans = stage_plans(g)
    for k, plan in enumerate(plans):
        mg = plan.graph
        gelu = [m for nid, m in plan.tasks if mg.node(nid).op is Op.GELU]
        first_back = next(i for i, (nid, m) in enumerate(plan.tasks) if mg.node(nid).op is Op.ERF)   # gelu's VJP
        forwards_first = sum(1 for nid, m in plan.tasks[:first_back] if mg.node(nid).op is Op.GELU)
        assert gelu == sorted(gelu) and len(gelu) == 8
        assert forwards_first == min(8, 4 - k), (k, forwards_first)
    assert_ranks_match_one_process(g, world=4)


# --- the runtime on strict point-to-point ------------------------------------------------------
# `SpmdExecutor._run_stages` with every rank on a thread of this process and transfers that behave
# as NCCL's do: each pair of ranks matches its operations strictly in the order both sides posted
# them (a send meets the other side's receive at the same place in the pair's sequence, or nothing
# moves), so a posting order that would hang NCCL fails here at once.

class _Work:
    def __init__(self, done: threading.Event, fake: "StrictP2P") -> None:
        self.done, self.fake = done, fake

    def wait(self) -> bool:
        deadline = time.monotonic() + 60      # a loaded host can be slow; a hang still ends
        while not self.done.wait(0.05):
            if self.fake.broken or time.monotonic() > deadline:
                raise RuntimeError(self.fake.broken or "a transfer never completed (it would hang on NCCL)")
        return True

    def is_completed(self) -> bool:
        return self.done.is_set()


class StrictP2P:
    """isend/irecv/send/recv for ranks on threads; per pair, operations complete in posting order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[tuple[int, int], list] = {}     # (me, peer) -> posted, not yet matched
        self.local = threading.local()
        self.broken: str | None = None
        self.sent: dict[int, int] = {}
        self.calls: dict[tuple, int] = {}
        self.slots: dict[tuple, dict] = {}
        self.collectives = 0

    def _post(self, kind: str, tensor: torch.Tensor, peer: int, tag: int) -> _Work:
        me = self.local.rank
        done = threading.Event()
        with self.lock:
            self.queues.setdefault((me, peer), []).append((kind, tensor, tag, done))
            mine, theirs = self.queues[(me, peer)], self.queues.setdefault((peer, me), [])
            while mine and theirs and not self.broken:
                (k1, t1, g1, e1), (k2, t2, g2, e2) = mine[0], theirs[0]
                if k1 == k2 or g1 != g2 or t1.shape != t2.shape or t1.dtype != t2.dtype:
                    self.broken = (f"ranks {me} and {peer} posted {k1} (tag {g1}) against {k2} (tag {g2}): "
                                   "NCCL would hang")
                    break
                src, dst = (t1, t2) if k1 == "send" else (t2, t1)
                dst.copy_(src)
                mine.pop(0)
                theirs.pop(0)
                e1.set()
                e2.set()
        return _Work(done, self)

    def isend(self, tensor, dst, tag=0):
        self.sent[self.local.rank] = self.sent.get(self.local.rank, 0) + 1
        return self._post("send", tensor.clone(), dst, tag)

    def irecv(self, tensor, src, tag=0):
        return self._post("recv", tensor, src, tag)

    def send(self, tensor, dst, tag=0):
        self._post("send", tensor.clone(), dst, tag).wait()

    def recv(self, tensor, src, tag=0):
        self._post("recv", tensor, src, tag).wait()

    # Collectives in a group (a stage's GPUs): the k-th call of every member meets the others'
    # k-th call, which must be the same operation on the same shape, or NCCL would hang.
    def new_group(self, ranks):
        return tuple(ranks)

    def all_reduce(self, tensor, group=None, async_op=False):
        work = self._collective("all_reduce", group, tensor, None)
        return work if async_op else work.wait()

    def all_gather(self, parts, tensor, group=None, async_op=False):
        work = self._collective("all_gather", group, tensor, parts)
        return work if async_op else work.wait()

    def _collective(self, op: str, group: tuple, tensor: torch.Tensor, parts) -> _Work:
        me = self.local.rank
        assert me in group, (me, group)
        if not tensor.is_contiguous():              # NCCL refuses these (ValueError)
            self.broken = f"rank {me} passed a non-contiguous {tuple(tensor.shape)} tensor to {op}"
        with self.lock:
            k = self.calls[(group, me)] = self.calls.get((group, me), -1) + 1
            slot = self.slots.setdefault((group, k), {"op": op, "shape": tuple(tensor.shape), "in": {},
                                                      "done": threading.Event()})
            if (slot["op"], slot["shape"]) != (op, tuple(tensor.shape)):
                self.broken = (f"rank {me}'s call {k} in group {group} is {op} {tuple(tensor.shape)}, another "
                               f"member's is {slot['op']} {slot['shape']}: NCCL would hang")
            slot["in"][me] = (tensor, parts)
            if len(slot["in"]) == len(group):
                mine = [slot["in"][r][0].clone() for r in group]
                for r in group:
                    t, out = slot["in"][r]
                    if op == "all_reduce":
                        t.copy_(torch.stack(mine).sum(0))
                    else:
                        for j, x in enumerate(mine):
                            out[j].copy_(x)
                slot["done"].set()
                self.collectives += 1
        return _Work(slot["done"], self)


def run_threads(monkeypatch, graph, world: int, inputs: dict, shares: bool = False) -> dict:
    """Every rank's `_run_stages` on a thread; with `shares`, each rank of a stage of several GPUs
    gets only its replica's share of the batch (as `xgrun` loads it), else the whole inputs."""
    from xgbuild.compiler.ir.stages import rank_share
    fake = StrictP2P()
    monkeypatch.setattr(spmd, "dist", fake)
    results, errors = {}, {}

    def rank(r: int) -> None:
        fake.local.rank = r
        split, piece, pieces = rank_share(graph, r) if shares else ({}, 0, 1)
        mine = {k: (v.chunk(pieces, split[k])[piece] if k in split else v) for k, v in inputs.items()}
        try:
            ex = SpmdExecutor(Group(r, world, "cpu"), float64=True, check=False)
            results[r] = ex._run_stages(graph, dict(mine), split)
            for _ in range(2):                       # again: the plan and the pair links are reused
                again = ex._run_stages(graph, dict(mine), split)
                assert all(torch.equal(again.values[i], v) for i, v in results[r].values.items())
        except BaseException as exc:  # noqa: BLE001 (reported below, per rank)
            errors[r] = exc
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not fake.broken, fake.broken
    assert not errors, errors
    if len(stage_gpus(graph)[0]) > 1 and any(n.op is Op.MICROBATCH for n in graph.nodes):
        assert fake.collectives > 0                  # the replicas combined their microbatches
    return results[0].values


def program(plan_text: str, tmp_path: Path, src: Path, num_gpu: int):
    (tmp_path / "p.toml").write_text(plan_text)
    return compile_file(src, CheckOptions(num_gpu=num_gpu), plan=load_plan(tmp_path / "p.toml")).optimized.main


EXAMPLE_PLAN = (REPO_ROOT / "examples" / "pipeline.toml").read_text()
TRAIN4 = (REPO_ROOT / "models" / "plans" / "train_pipeline4.toml").read_text()
CASES = {
    "example-1f1b": (EXAMPLE_PLAN, REPO_ROOT / "examples" / "pipeline.xg", 2),
    "example-gpipe": (EXAMPLE_PLAN + 'schedule = "gpipe"\n', REPO_ROOT / "examples" / "pipeline.xg", 2),
    "train-4-stages": (TRAIN4, REPO_ROOT / "models" / "train_tiny.xg", 4),
    "train-4-stages-4-microbatches": (TRAIN4 + "\n[pipeline]\nmicrobatches = 4\nsplit = { TOKENS = 0, TARGETS = 0 }\n",
                                      REPO_ROOT / "models" / "train_tiny.xg", 4),
    # Stages of several GPUs: data-parallel replicas of the pipeline.
    "train-2-stages-of-2-gpus": ((REPO_ROOT / "models" / "plans" / "train_pipeline_dp.toml").read_text(),
                                 REPO_ROOT / "models" / "train_tiny.xg", 4),
    "train-2-stages-of-2-gpus-2-microbatches-shares": (
        (REPO_ROOT / "models" / "plans" / "train_pipeline_dp.toml").read_text() + "microbatches = 2\n",
        REPO_ROOT / "models" / "train_tiny.xg", 4),
    "example-2-stages-of-2-gpus-gpipe": (EXAMPLE_PLAN.replace("microbatches = 4", "microbatches = 2")
                                         + 'schedule = "gpipe"\n', REPO_ROOT / "examples" / "pipeline.xg", 4),
    "example-2-stages-of-4-gpus-shares": (EXAMPLE_PLAN, REPO_ROOT / "examples" / "pipeline.xg", 8),
    # The batch input `S` is never read: nothing is split, each replica computes the whole values.
    "unread-batch-2-stages-of-2-gpus": ("[regions.fa]\nstage = 0\n[regions.fb]\nstage = 1\n"
                                        "[pipeline]\nsplit = { S = 0 }\n", "UNREAD", 4),
    # A weight stored (out, in) and used as `h @ transpose(w)`: its gradient's addends are strided
    # views, and the running sum all-reduced inside the stage must still be contiguous (NCCL).
    "transposed-weight-2-stages-of-2-gpus": (EXAMPLE_PLAN, "TRANSPOSED", 4),
    # Stage 1 holds no region: its GPUs (2 and 3) idle, yet take part in making the stages' groups.
    "example-stages-0-and-2-of-2-gpus": (EXAMPLE_PLAN.replace("stage = 1", "stage = 2"),
                                         REPO_ROOT / "examples" / "pipeline.xg", 6),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rank_on_strict_point_to_point_gives_one_process_result(monkeypatch, tmp_path: Path, case: str) -> None:
    text, src, world = CASES[case]
    if src == "TRANSPOSED":
        src = tmp_path / "transposed.xg"
        src.write_text(EXAMPLE.read_text().replace("Tensor[float32, 16, 8] W2", "Tensor[float32, 8, 16] W2")
                       .replace("Tensor[float32, H, C] w) -> Tensor[float32, B, C] {\n    return h @ w",
                                "Tensor[float32, C, H] w) -> Tensor[float32, B, C] {\n    return h @ transpose(w)")
                       .replace("Tensor[float32, H, C] w2) -> float32", "Tensor[float32, C, H] w2) -> float32"))
        assert "transpose(w)" in src.read_text()
    if src == "UNREAD":
        src = tmp_path / "unread.xg"
        src.write_text(DEADLOCK.replace("NUM_GPU = 2", "NUM_GPU = 1").replace(
            "extern Tensor[float32, 4, 4] W2", "extern Tensor[float32, 4, 4] W2\nextern Tensor[float32, 8, 2] S"))
    g = program(text, tmp_path, src, world)
    inputs = train_values(g)
    got, want = run_threads(monkeypatch, g, world, inputs, case.endswith("shares")), whole_run(g, inputs)
    assert set(got) == set(want)
    for i, w in want.items():
        err = float((got[i] - w).norm() / max(float(w.norm()), 1e-30))
        assert err < 1e-9, (case, i, err)
