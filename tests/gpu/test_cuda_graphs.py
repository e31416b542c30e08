"""CUDA graph replay on a real GPU: a signature's second run is captured, later runs replay it. Every
run matches the float64 CPU reference, replayed results are bit-identical to kernel-by-kernel ones,
and a result never changes when the engine runs again (outputs are the caller's own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gpu_target import local_target

import xg
from xgbuild.build.package import engine_of
from xgbuild.compiler.driver import compile_file
from xgbuild.hw import load_profile
from xgbuild.runtime.engine import Engine
from xgbuild.runtime.tensor_io import random_inputs
from xgbuild.settings import RunSettings
from xgbuild.tuner.link import build_kernels

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
from torch_models import make  # noqa: E402

PROGRAMS = ["mlp", "norms", "attention", "contract", "safe_div"]


@pytest.fixture(autouse=True)
def graphs_on(monkeypatch) -> None:
    monkeypatch.delenv("XG_CUDA_GRAPHS", raising=False)   # the default: capture on


def runnable(engine: Engine) -> Engine:
    """The engine with the run settings of this test's environment (as xgrun and `xg` read them)."""
    return Engine(engine.file, RunSettings.from_env())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", [p for p in PROGRAMS if (REPO / "examples" / f"{p}.xg").exists()])
def test_replayed_runs_match_reference_and_never_alias(name: str, monkeypatch) -> None:
    compiled = compile_file(REPO / "examples" / f"{name}.xg")
    dims = {"T": 64, "D": 96, "F": 128, "S": 64, "N": 64, "M": 64, "K": 64, "B": 4}
    engine = runnable(engine_of(compiled, build_kernels(compiled.optimized.main, load_profile(local_target()),
                                                        policy="predict", dims=dims)))
    sig = {s["name"]: (s["dtype"], tuple(dims.get(d, d) if isinstance(d, str) else d for d in s["shape"]))
           for s in engine.signature}
    runs = []
    for seed in range(4):                               # run, capture, replay, replay
        inputs = random_inputs(sig, seed=seed)
        got = engine.run({k: v.cuda() for k, v in inputs.items()}, device="cuda", wait=False)
        runs.append((inputs, {k: v.clone() for k, v in got.tensors.items()}, got))
    ex = engine.cuda_executor()
    assert ex._captured, "the second run at one signature is captured as a CUDA graph"
    cap = next(iter(ex._captured.values()))
    assert not engine.signature or cap.binder is not None and not cap.copied and cap.fresh, \
        f"replays read the caller's inputs and write fresh outputs, no copies ({ex.rebind_failure})"
    for inputs, snapshot, got in runs:
        ref = engine.run(inputs, device="cpu", float64=True)
        for k, r in ref.tensors.items():
            assert torch.equal(got.tensors[k], snapshot[k]), f"{k}: a later run changed this result"
            if r.dtype.is_floating_point:
                assert rel(got.tensors[k], r) < (3e-2 if got.tensors[k].dtype == torch.bfloat16 else 1e-4), k
    # kernel by kernel, the same bits
    monkeypatch.setenv("XG_CUDA_GRAPHS", "0")
    plain = runnable(engine_of(compiled, build_kernels(compiled.optimized.main, load_profile(local_target()),
                                                       policy="predict", dims=dims)))
    # an input changed in place between replays (same address, so no node moves): the new values count
    inputs = random_inputs(sig, seed=9)
    held = {k: v.cuda() for k, v in random_inputs(sig, seed=8).items()}
    engine.run(held, device="cuda").wait()
    for k, v in held.items():
        v.copy_(inputs[k])
    moved = engine.run(held, device="cuda").tensors
    ref = engine.run(inputs, device="cpu", float64=True)
    for k, r in ref.tensors.items():
        if r.dtype.is_floating_point:
            assert rel(moved[k], r) < (3e-2 if moved[k].dtype == torch.bfloat16 else 1e-4), k
    inputs, snapshot, _ = runs[-1]
    again = plain.run({k: v.cuda() for k, v in inputs.items()}, device="cuda")
    assert not plain.cuda_executor()._captured
    for k, v in snapshot.items():
        assert torch.equal(again.tensors[k], v), k


def test_imported_model_replays_with_weights_in_place() -> None:
    model, inputs, dyn = make("gpt")
    engine = xg.compile(model, inputs, target=local_target(), tune="predict", dynamic_shapes=dyn)
    outs = []
    for seed in range(4):
        idx = make("gpt", batch=3, seed=20 + seed)[1][0]
        outs.append((idx, engine(idx.cuda()).clone(), engine(idx.cuda())))
    ex = engine.engine.cuda_executor()
    assert ex._captured and ex.stable, "weights are read in place by the captured graph"
    with torch.no_grad():
        ref_model = model.double()
        for idx, first, second in outs:
            ref = ref_model(idx)
            assert rel(first, ref) < 1e-4 and torch.equal(first, second)


def test_an_out_of_range_token_is_refused_at_every_stage_of_replay() -> None:
    # The index range of a CUDA input is read after the run, with its other checks (no sync before
    # the work is queued): a bad token id is still an InputError naming the input, whether the run
    # launches kernel by kernel, captures or replays, and good runs around it are unaffected.
    from xgbuild.errors import InputError
    model, inputs, dyn = make("gpt")
    engine = xg.compile(model, inputs, target=local_target(), tune="predict", dynamic_shapes=dyn)
    good = make("gpt", batch=3, seed=5)[1][0].cuda()
    vocab = model.wte.weight.shape[0]
    bad = good.clone()
    bad[1, 2] = 10 ** 6
    want = engine(good).clone()
    for run in range(4):                    # kernel by kernel, capture, replay, replay
        engine(bad)                         # queued: the range is read with the run's other checks
        with pytest.raises(InputError, match=r"holds 1000000, outside \[0, "):
            engine.synchronize()
        assert torch.equal(engine(good), want), run
        engine(bad)
        torch.cuda.synchronize()
        with pytest.raises(InputError, match=r"run #\d+ of this engine, queued earlier.*holds 1000000"):
            engine(good)                    # the next call reports the finished run's bad input
    assert engine.engine.cuda_executor()._captured
    neg = good.clone()
    neg[0, 0] = -1
    engine(neg)
    with pytest.raises(InputError, match="holds -1"):
        engine.synchronize()


def test_eager_fallback_ops_run_between_kernels_on_cuda() -> None:
    sys.path.insert(0, str(REPO / "tests" / "unit" / "importers"))
    from test_fallback import Ranker
    torch.manual_seed(0)
    model = Ranker().eval()
    engine = xg.compile(model, (torch.randn(4, 16),), target=local_target(), tune="predict", fallback="eager")
    with torch.no_grad():
        ref_model = model.double()
        for seed in range(3):                           # run, capture, replay
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))
            got = engine(x.cuda())
            ref = ref_model(x.double())
            assert got[0].is_cuda and rel(got[0], ref[0]) < 1e-4 and rel(got[1], ref[1]) < 1e-4
            assert torch.equal(got[2].cpu(), ref[2])
