"""xg.compile on the five example models: outputs against float64 eager on fresh inputs, a
dynamic batch dim specialised per size, save/load, deterministic bytes."""

from __future__ import annotations

import pytest
import torch

import xg
from zoo import NAMES, TOL, as_tuple, fresh_inputs, make, reference, rel_err


@pytest.fixture(scope="module")
def engines() -> dict:
    out = {}
    for name in NAMES:
        model, inputs, dyn = make(name)
        out[name] = (model, xg.compile(model, inputs, kernels=False, dynamic_shapes=dyn))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_matches_eager(engines, name: str) -> None:
    model, engine = engines[name]
    inputs = fresh_inputs(name)
    got = as_tuple(engine(*inputs))
    refs = reference(model, inputs)
    with torch.no_grad():
        eager32 = as_tuple(model(*inputs))
    assert len(got) == len(refs)
    for y, r, e in zip(got, refs, eager32):
        assert y.dtype == e.dtype and y.shape == e.shape
        assert rel_err(y, r) < TOL, f"{name}: {rel_err(y, r):.2e} against float64 eager"
        assert rel_err(y, e) < TOL, f"{name}: {rel_err(y, e):.2e} against float32 eager"


@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_dynamic_batch_specialises_per_size(engines, name: str) -> None:
    model, engine = engines[name]
    assert engine.signature[0]["shape"][0] == "batch"
    for batch in (3, 5, 3):
        inputs = fresh_inputs(name, batch)
        (y,) = as_tuple(engine(*inputs))[:1]
        assert y.shape[0] == batch
        assert rel_err(y, reference(model, inputs)[0]) < TOL
    first = engine.signature[0]["name"]
    sizes = [dict((n, s) for n, _, s in key)[first][0] for key in engine.engine._specialised]
    assert sorted(sizes).count(3) == 1 and 5 in sizes              # one specialisation per size, reused


def test_save_load_same_results(engines, tmp_path) -> None:
    model, engine = engines["bert"]
    path = tmp_path / "bert.xge"
    digest = engine.save(path)
    loaded = xg.load_model_engine(path)
    assert loaded.digest == digest
    assert "weights" in loaded.manifest
    assert {s["name"] for s in loaded.signature} == {"input_ids", "attention_mask"}
    inputs = fresh_inputs("bert")
    for a, b in zip(as_tuple(engine(*inputs)), as_tuple(loaded(*inputs))):
        assert torch.equal(a, b)


def test_same_model_same_bytes(tmp_path) -> None:
    model, inputs, _ = make("mlp")
    a = xg.compile(model, inputs, kernels=False)
    b = xg.compile(make("mlp")[0], inputs, kernels=False)
    assert a.save(tmp_path / "a.xge") == b.save(tmp_path / "b.xge")
    assert (tmp_path / "a.xge").read_bytes() == (tmp_path / "b.xge").read_bytes()
    other, _, _ = make("mlp", seed=1)
    c = xg.compile(other, inputs, kernels=False)
    assert c.save(tmp_path / "c.xge") != a.digest                   # other weights: other bytes


def test_function_and_tied_weights() -> None:
    w = torch.randn(8, 4)

    def fn(x, y):
        return torch.softmax(x @ w, dim=0) * y.sum()
    x, y = torch.randn(3, 8), torch.randn(5)
    engine = xg.compile(fn, (x, y), kernels=False)
    ref = torch.softmax(x.double() @ w.double(), dim=0) * y.double().sum()
    assert rel_err(engine(x, y), ref) < TOL
    gpt = xg.compile(*make("gpt")[:2], kernels=False)
    names = {t["name"] for t in gpt.manifest["weights"]["tensors"]}
    assert len(names & {"wte.weight", "head.weight"}) == 1           # tied: stored once


def test_unused_buffers_stay_out_of_the_engine() -> None:
    model, inputs, _ = make("resnet")
    engine = xg.compile(model, inputs, kernels=False)
    names = {t["name"] for t in engine.manifest["weights"]["tensors"]}
    assert "stem.1.running_mean" in names
    assert not any(n.endswith("num_batches_tracked") for n in names)


def test_structured_outputs_keep_their_structure(tmp_path) -> None:
    def fn(x):
        return {"double": x * 2, "parts": [x.sum(0), x.amax(1)]}
    x = torch.randn(3, 4)
    engine = xg.compile(fn, (x,), kernels=False)
    out = engine(x)
    assert set(out) == {"double", "parts"} and len(out["parts"]) == 2
    assert torch.equal(out["double"], x * 2)
    engine.save(tmp_path / "s.xge")
    flat = xg.load_model_engine(tmp_path / "s.xge")(x)      # from a file: a flat tuple, in pytree order
    assert len(flat) == 3 and torch.equal(flat[0], x * 2)
