"""transformers' architectures through xg.compile with no fallback (issue 20): models from configs
(random weights, 2 layers, hidden 128), called with keyword inputs as users call them, with a
static shape and with a dynamic batch (and sequence length, for text models), against float64
eager on fresh inputs at two sizes."""

from __future__ import annotations

import warnings

import pytest
import torch

import xg
from hf_zoo import MORE, OTHERS, REQUIRED, build, output, reference, rel_err

pytest.importorskip("transformers")
TOL = 1e-4


def _compile(hf, dynamic: bool):
    kw = hf.inputs(2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)         # no fallback warning: everything translated
        warnings.filterwarnings("ignore", module="torch")
        warnings.filterwarnings("ignore", module="transformers")
        return xg.compile(hf.model, example_kwargs=kw, kernels=False,
                          dynamic_shapes=hf.dynamic() if dynamic else None)


def _check(hf, engine, batch: int, seq: int) -> None:
    kw = hf.inputs(batch, seq)
    got = output(engine(**kw))
    want = reference(hf.model, kw)
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = rel_err(got, want)
    assert err < TOL, f"{hf.name} at batch {batch}, seq {seq}: {err:.2e} against float64 eager"


@pytest.fixture(scope="module", params=REQUIRED)
def required(request):
    return build(request.param)


def test_static_shape(required) -> None:
    engine = _compile(required, dynamic=False)
    for _ in range(2):                                       # two fresh draws at the captured size
        _check(required, engine, 2, 16)
    with pytest.raises(xg.InputError, match="must have shape"):
        engine(**required.inputs(3, 16))


def test_dynamic_batch_and_sequence(required) -> None:
    engine = _compile(required, dynamic=True)
    names = {s["name"]: s["shape"] for s in engine.signature}
    first = next(iter(required.inputs(2, 16)))
    assert names[first][0] == "batch"
    if required.text:
        assert names[first][1] == "seq"
    for batch, seq in required.sizes:
        _check(required, engine, batch, seq if required.text else 16)


@pytest.mark.parametrize("name", OTHERS + MORE)
def test_other_architectures(name: str) -> None:
    hf = build(name)
    engine = _compile(hf, dynamic=True)
    for batch, seq in hf.sizes:
        _check(hf, engine, batch, seq if hf.text else 16)


def test_llama_outside_no_grad_inlines_the_grad_mode_region() -> None:
    """Llama's rotary embedding runs under torch.no_grad() inside the model: captured outside
    no_grad, export wraps it in a higher-order op that the translator inlines."""
    hf = build("llama")
    kw = hf.inputs(2, 16)
    engine = xg.compile(hf.model, example_kwargs=kw, kernels=False)
    _check(hf, engine, 2, 16)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "mistral", "vit", "whisper"])
def test_attention_is_one_fused_kernel_per_layer(name: str) -> None:
    """Each layer's attention, its padding / causal / sliding-window mask included, schedules as
    one flash-style kernel on the GPU (the mask's empty-row guard stays outside it)."""
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import kernel_specs
    from xgbuild.compiler.importers.torch_export import import_torch
    hf = build(name)
    imported = import_torch(hf.model, example_kwargs=hf.inputs(2, 16), dynamic_shapes=hf.dynamic())
    specs = [spec for spec, _b in kernel_specs(schedule(imported.optimized.main)) if spec.kind == "attention"]
    assert len(specs) == 2, f"{name}: {len(specs)} fused attention kernels for 2 layers"
