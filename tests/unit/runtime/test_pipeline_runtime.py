"""The pipeline runtime (`SpmdExecutor._run_stages`) with every rank on a thread of this process and
point-to-point transfers that behave as NCCL's do: each pair of ranks matches its operations
strictly in the order both sides posted them (a send meets the other side's receive at the same
place in the pair's sequence, or nothing moves), so a posting order that would hang NCCL fails
here at once. Outputs are checked against one process in float64; what each rank freed and sent
is checked against what it needed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from xgbuild.compiler.driver import compile_file
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.frontend.shard_plan import load_plan
from xgbuild.compiler.ir.graph import tree_ids
from xgbuild.runtime import spmd
from xgbuild.runtime.cpu import CpuExecutor
from xgbuild.runtime.spmd import Group, SpmdExecutor

REPO = Path(__file__).resolve().parents[3]


class _Work:
    def __init__(self, done: threading.Event, fake: "StrictP2P") -> None:
        self.done, self.fake = done, fake

    def wait(self) -> bool:
        deadline = time.monotonic() + 20
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


def run_threads(monkeypatch, graph, world: int, inputs: dict) -> dict:
    fake = StrictP2P()
    monkeypatch.setattr(spmd, "dist", fake)
    results, errors = {}, {}

    def rank(r: int) -> None:
        fake.local.rank = r
        try:
            ex = SpmdExecutor(Group(r, world, "cpu"), float64=True, check=False)
            results[r] = ex._run_stages(graph, dict(inputs))
            for _ in range(2):                       # again: the plan and the pair links are reused
                again = ex._run_stages(graph, dict(inputs))
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
    return results[0].values


def program(plan_text: str, tmp_path: Path, src: Path, num_gpu: int):
    (tmp_path / "p.toml").write_text(plan_text)
    return compile_file(src, CheckOptions(num_gpu=num_gpu), plan=load_plan(tmp_path / "p.toml")).optimized.main


def fresh_inputs(graph) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(time.time_ns() % 2**62)
    out = {}
    for name, nid in graph.inputs:
        n = graph.node(nid)
        shape = tuple(n.shape)
        if n.dtype == "int64":
            out[name] = torch.randint(0, 16, shape, generator=gen)
        elif name in ("STEP", "LR"):
            out[name] = torch.tensor(3.0 if name == "STEP" else 0.01, dtype=torch.float64)
        elif name.startswith("V_"):
            out[name] = torch.rand(shape, generator=gen, dtype=torch.float64) * 1e-3 + 1e-3
        else:
            out[name] = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
    return out


def one_process(graph, inputs) -> dict[int, torch.Tensor]:
    ex = CpuExecutor(float64=True, check=False, timings=False)
    vals: dict[int, torch.Tensor] = {}
    for n in graph.nodes:
        vals[n.id] = ex.eval(n, [vals[i] for i in n.inputs], inputs)
    return {i: vals[i] for i in tree_ids(graph.output)}


EXAMPLE_PLAN = (REPO / "examples" / "pipeline.toml").read_text()
TRAIN4 = (REPO / "models" / "plans" / "train_pipeline4.toml").read_text()
CASES = {
    "example-1f1b": (EXAMPLE_PLAN, REPO / "examples" / "pipeline.xg", 2),
    "example-gpipe": (EXAMPLE_PLAN + 'schedule = "gpipe"\n', REPO / "examples" / "pipeline.xg", 2),
    "train-4-stages": (TRAIN4, REPO / "models" / "train.xg", 4),
    "train-4-stages-4-microbatches": (TRAIN4 + "\n[pipeline]\nmicrobatches = 4\nsplit = { TOKENS = 0, TARGETS = 0 }\n",
                                      REPO / "models" / "train.xg", 4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rank_on_strict_point_to_point_gives_one_process_result(monkeypatch, tmp_path: Path, case: str) -> None:
    text, src, world = CASES[case]
    g = program(text, tmp_path, src, world)
    inputs = fresh_inputs(g)
    got, want = run_threads(monkeypatch, g, world, inputs), one_process(g, inputs)
    assert set(got) == set(want)
    for i, w in want.items():
        err = float((got[i] - w).norm() / max(float(w.norm()), 1e-30))
        assert err < 1e-9, (case, i, err)
