"""xg.compile with keyword inputs: `example_kwargs`, dynamic shapes by parameter name, engines
called positionally (in forward's order) and by keyword, constants fixed at capture, and every way
a call can misfit, each an InputError naming the input."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import xg

VOCAB = 50


class Tagger(nn.Module):
    """forward's second parameter is not the mask (as GPT2's is `past_key_values`)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, input_ids, past=None, attention_mask=None, use_cache=False, scale=1.0):
        h = self.emb(input_ids) * scale
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1).to(h.dtype)
        return self.proj(h)


def inputs(batch: int = 2, seq: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2:] = 0
    return {"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=g), "attention_mask": mask}


DYNAMIC = {"input_ids": {0: Dim("batch", max=64), 1: Dim("seq", max=64)},
           "attention_mask": {0: Dim("batch", max=64), 1: Dim("seq", max=64)}}


@pytest.fixture(scope="module")
def tagger():
    model = Tagger().eval()
    engine = xg.compile(model, example_kwargs={**inputs(), "scale": 2.0}, dynamic_shapes=DYNAMIC, kernels=False)
    return model, engine


def eager(model, kw: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**kw)


def test_inputs_named_as_forward_parameters(tagger) -> None:
    _, engine = tagger
    assert [(s["name"], s["shape"]) for s in engine.signature] == [
        ("input_ids", ["batch", "seq"]), ("attention_mask", ["batch", "seq"])]


def test_keyword_call_matches_eager_at_other_sizes(tagger) -> None:
    model, engine = tagger
    for batch, seq in ((2, 6), (3, 9)):
        kw = inputs(batch, seq, seed=batch)
        assert torch.allclose(engine(**kw), eager(model, {**kw, "scale": 2.0}), rtol=1e-5, atol=1e-6)


def test_positional_and_keyword_mixed(tagger) -> None:
    model, engine = tagger
    kw = inputs(seed=3)
    got = engine(kw["input_ids"], attention_mask=kw["attention_mask"], scale=2.0, use_cache=False, past=None)
    assert torch.allclose(got, eager(model, {**kw, "scale": 2.0}), rtol=1e-5, atol=1e-6)


def test_a_positional_mask_in_the_place_of_past_is_refused(tagger) -> None:
    _, engine = tagger
    kw = inputs()
    with pytest.raises(xg.InputError, match=r"`past` was None when the model was compiled .* positional argument 2 "
                                            r"fills the model's parameter `past`: pass tensors by keyword"):
        engine(kw["input_ids"], kw["attention_mask"])


@pytest.mark.parametrize("call, message", [
    (lambda kw: dict(**kw, mask=kw["attention_mask"]), r"unknown keyword argument `mask`; the engine takes 2 inputs "
                                                       r"\(input_ids: int64\[batch, seq\], attention_mask: int64\[batch, seq\]\)"),
    (lambda kw: dict(input_ids=kw["input_ids"]), r"missing input `attention_mask`: the engine takes 2 inputs"),
    (lambda kw: dict(input_ids=kw["input_ids"], attention_mask=None), r"input `attention_mask` is None; the engine "
                                                                     r"was built with a tensor there \(int64\[batch, seq\]\)"),
    (lambda kw: dict(input_ids=kw["input_ids"], attention_mask=[1, 0]), r"input `attention_mask` is a list; the engine "
                                                                       r"expects a tensor"),
    (lambda kw: dict(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"].float()),
     r"input `attention_mask` has dtype float32, the engine expects int64"),
    (lambda kw: dict(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"][:, :4]),
     r"`attention_mask` has seq = 4 .* earlier input fixed seq = 6"),
    (lambda kw: dict(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"].to("meta")),
     r"inputs are on several devices \(`input_ids` on cpu, `attention_mask` on meta\)"),
    (lambda kw: dict(**kw, use_cache=True), r"`use_cache` was False when the model was compiled and the engine "
                                            r"computes that case only; got True"),
    (lambda kw: dict(**kw, scale=1.0), r"`scale` was 2.0 when the model was compiled .*; got 1.0"),
    (lambda kw: dict(**kw, scale=2), r"`scale` was 2.0 when the model was compiled .*; got 2"),
])
def test_bad_keyword_calls(tagger, call, message) -> None:
    _, engine = tagger
    with pytest.raises(xg.InputError, match=message):
        engine(**call(inputs()))


def test_bad_positional_calls(tagger) -> None:
    _, engine = tagger
    kw = inputs()
    ids, mask = kw["input_ids"], kw["attention_mask"]
    with pytest.raises(xg.InputError, match=r"input `input_ids` is given twice: as positional argument 1 and by keyword"):
        engine(ids, input_ids=ids, attention_mask=mask)
    with pytest.raises(xg.InputError, match=r"the engine takes 2 inputs \(.*\), got 6 positional arguments"):
        engine(ids, None, mask, False, 2.0, None)


def test_index_input_out_of_range_on_cpu(tagger, tmp_path) -> None:
    _, engine = tagger
    kw = inputs()
    kw["input_ids"][1, 2] = VOCAB
    with pytest.raises(xg.InputError, match=rf"input `input_ids` holds {VOCAB}, outside \[0, {VOCAB}\)"):
        engine(**kw)
    kw["input_ids"][1, 2] = -1
    with pytest.raises(xg.InputError, match=rf"input `input_ids` holds -1, outside \[0, {VOCAB}\)"):
        engine(**kw)
    engine.save(tmp_path / "t.xge")
    with pytest.raises(xg.InputError, match=r"input `input_ids` holds -1"):
        xg.load_model_engine(tmp_path / "t.xge")(**kw)


def test_loaded_engine_binds_in_input_order_and_by_name(tagger, tmp_path) -> None:
    model, engine = tagger
    engine.save(tmp_path / "t.xge")
    loaded = xg.load_model_engine(tmp_path / "t.xge")
    kw = inputs(3, 5, seed=7)
    want = eager(model, {**kw, "scale": 2.0})
    assert torch.allclose(loaded(kw["input_ids"], kw["attention_mask"]), want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(loaded(attention_mask=kw["attention_mask"], input_ids=kw["input_ids"]), want,
                          rtol=1e-5, atol=1e-6)
    with pytest.raises(xg.InputError, match="unknown keyword argument `use_cache`"):
        loaded(**kw, use_cache=False)


def test_positional_examples_name_inputs_too() -> None:
    model = Tagger().eval()
    kw = inputs()
    engine = xg.compile(model, (kw["input_ids"], None, kw["attention_mask"]), kernels=False)
    assert [s["name"] for s in engine.signature] == ["input_ids", "attention_mask"]
    assert torch.allclose(engine(kw["input_ids"], None, kw["attention_mask"]), eager(model, kw), rtol=1e-5, atol=1e-6)
    assert torch.allclose(engine(**kw), eager(model, kw), rtol=1e-5, atol=1e-6)


def test_functions_take_keywords_by_their_parameter_names() -> None:
    def fn(a, b, *, scale=3.0):
        return a * scale + b
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    engine = xg.compile(fn, (a,), example_kwargs={"b": b}, kernels=False,
                        dynamic_shapes={"a": {0: Dim("n")}, "b": {0: Dim("n")}})
    assert [(s["name"], s["shape"]) for s in engine.signature] == [("a", ["n", 3]), ("b", ["n", 3])]
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    assert torch.allclose(engine(b=b, a=a), fn(a, b))
    with pytest.raises(xg.InputError, match="`scale` was 3.0"):
        engine(a, b, scale=1.0)


@pytest.mark.parametrize("bad, message", [
    (dict(example_kwargs=[1]), "example_kwargs must be a dict of keyword inputs"),
    (dict(example_kwargs={"input_ids": object()}), r"example_kwargs\['input_ids'\] is a object; pass tensors, or "
                                                   r"constants"),
    (dict(example_kwargs={**inputs(), "token_type_ids": torch.zeros(2, 6, dtype=torch.long)}),
     r"the example inputs do not fit the model's parameters .*token_type_ids"),
    (dict(example_inputs=(torch.zeros(2, 6, dtype=torch.long),), example_kwargs={"input_ids": torch.zeros(2, 6)}),
     r"do not fit .*multiple values for argument 'input_ids'"),
    (dict(example_kwargs=inputs(), dynamic_shapes={"input_ids": {0: Dim("b")}, "mask": {0: Dim("b")}}),
     r"dynamic_shapes names `mask`, which the example inputs do not give; they give `input_ids`, `attention_mask`"),
])
def test_bad_example_kwargs(bad, message) -> None:
    with pytest.raises(xg.XGError, match=message):
        xg.compile(Tagger().eval(), **{"example_inputs": None, **bad}, kernels=False)


def test_lazy_engine_takes_keywords() -> None:
    model = Tagger().eval()
    engine = xg.compile(model, kernels=False)
    kw = inputs()
    assert torch.allclose(engine(**kw), eager(model, kw), rtol=1e-5, atol=1e-6)
    assert [s["name"] for s in engine.signature] == ["input_ids", "attention_mask"]
    first = engine.digest
    # The same tensors under other names, or another constant, are another signature: built again.
    ids = kw["input_ids"]
    assert torch.allclose(engine(ids), eager(model, {"input_ids": ids}), rtol=1e-5, atol=1e-6)
    assert engine.digest != first
    assert torch.allclose(engine(**kw, scale=0.5), eager(model, {**kw, "scale": 0.5}), rtol=1e-5, atol=1e-6)
    assert len(engine._engines) == 3
    engine(**kw)
    assert len(engine._engines) == 3                     # seen before: no new build
    with pytest.raises(xg.InputError, match=r"input `past` is a dict; the engine takes tensors, and constants"):
        engine(**kw, past={})


@pytest.fixture(scope="module")
def gpt2():
    from hf_zoo import build
    return build("gpt2")


@pytest.mark.filterwarnings("ignore:xg.compile")     # ops the importer may still leave to PyTorch
def test_gpt2_with_keyword_inputs(gpt2) -> None:
    from hf_zoo import output, reference, rel_err
    engine = xg.compile(gpt2.model, example_kwargs=gpt2.inputs(2, 16), dynamic_shapes=gpt2.dynamic(), kernels=False,
                        fallback="eager")
    assert [s["name"] for s in engine.signature] == ["input_ids", "attention_mask"]
    kw = gpt2.inputs(3, 24)
    assert rel_err(output(engine(**kw)), reference(gpt2.model, kw)) < 1e-4
    with pytest.raises(xg.InputError, match=r"positional argument 2 fills the model's parameter `past_key_values`"):
        engine(kw["input_ids"], kw["attention_mask"])
    bad = dict(kw, input_ids=kw["input_ids"].clone())
    bad["input_ids"][0, 0] = 1000
    with pytest.raises(xg.InputError, match=r"input `input_ids` holds 1000, outside \[0, 1000\)"):
        engine(**bad)


def test_a_key_value_cache_is_refused_with_a_hint(gpt2) -> None:
    with pytest.raises(xg.CompileError, match=r"(?s)XG0805.*DynamicCache.*use_cache.: False"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            xg.compile(gpt2.model, example_kwargs={**gpt2.inputs(2, 16), "use_cache": True}, kernels=False)
