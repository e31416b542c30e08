"""The seed's form, `engine = xg.compile(model, target="GB200", num_gpu=1024)` with no example
inputs: the engine is built at its first call, again for a new input signature, and says so
clearly when asked for what only a built engine has."""

from __future__ import annotations

import pytest
import torch

import xg
from xgbuild.runtime.model_engine import MAX_SIGNATURES


class MyTorchModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(12, 24), torch.nn.Linear(24, 5)

    def forward(self, x):
        return torch.log_softmax(self.fc2(torch.nn.functional.gelu(self.fc1(x))), dim=-1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.filterwarnings("ignore:num_gpu=1024. the plan splits nothing")
def test_the_seed_snippet(tmp_path) -> None:
    model = MyTorchModel().eval()
    engine = xg.compile(model, target="GB200", num_gpu=1024)
    with pytest.raises(xg.XGError, match="built at its first call"):
        engine.save(tmp_path / "early.xge")
    g = torch.Generator().manual_seed(5)
    inputs = torch.randn(3, 12, generator=g)
    output = engine(inputs)
    with torch.no_grad():
        assert rel(output, model.double()(inputs.double())) < 1e-5
        model.float()
    assert engine.manifest["target"] == "GB200" and engine.manifest["num_gpu"] == 1024
    assert {v["arch"] for k in engine.manifest["kernels"] for v in k["variants"]} == {100}
    first = engine.digest
    other = torch.randn(7, 12, generator=g)             # a new batch size: built again
    with torch.no_grad():
        assert rel(engine(other), model.double()(other.double())) < 1e-5
    assert engine.digest != first
    engine.save(tmp_path / "m.xge")
    # One file for both batch sizes seen (issue 25: it used to keep the last one only).
    loaded = xg.load_model_engine(tmp_path / "m.xge")
    assert isinstance(loaded.signature[0]["shape"][0], str) and loaded.signature[0]["shape"][1] == 12


def test_bad_calls_are_clear_errors() -> None:
    engine = xg.compile(MyTorchModel().eval(), kernels=False)
    with pytest.raises(xg.InputError, match="input 0 is a list"):
        engine([1.0] * 12)
    with pytest.raises(xg.InputError, match="got none"):
        engine()
    with pytest.raises(xg.XGError, match="dynamic_shapes needs example_inputs"):
        xg.compile(MyTorchModel().eval(), dynamic_shapes=({0: torch.export.Dim("b")},))


def test_signatures_are_bounded() -> None:
    engine = xg.compile(MyTorchModel().eval(), kernels=False)
    for batch in range(1, MAX_SIGNATURES + 1):
        engine(torch.randn(batch, 12))
    with pytest.raises(xg.XGError, match="dynamic_shapes"):
        engine(torch.randn(MAX_SIGNATURES + 1, 12))


def test_save_after_several_batch_sizes_runs_them_all(tmp_path) -> None:
    model = MyTorchModel().eval()
    engine = xg.compile(model, kernels=False)
    g = torch.Generator().manual_seed(7)
    for batch in (3, 7):
        engine(torch.randn(batch, 12, generator=g))
    engine.save(tmp_path / "m.xge")
    loaded = xg.load_model_engine(tmp_path / "m.xge")
    with torch.no_grad():
        for batch in (3, 7, 5):
            x = torch.randn(batch, 12, generator=g)
            assert rel(loaded(x), model(x)) < 1e-5


def test_save_warns_when_it_cannot_keep_every_signature(tmp_path) -> None:
    engine = xg.compile(MyTorchModel().eval(), kernels=False)
    engine(torch.randn(3, 12))
    engine(torch.randn(2, 3, 12))            # another rank: no one engine takes both
    with pytest.warns(UserWarning, match="keeps the latest of 2 input signatures only") as caught:
        engine.save(tmp_path / "m.xge")
    assert {w.filename for w in caught} == {__file__}           # the warning names the user's line
    assert xg.load_model_engine(tmp_path / "m.xge").signature[0]["shape"] == [2, 3, 12]


def test_a_plan_that_splits_nothing_over_many_gpus_warns() -> None:
    with pytest.warns(UserWarning, match="num_gpu=1024: the plan splits nothing: each of the 1024 GPUs") as caught:
        xg.compile(MyTorchModel().eval(), (torch.randn(3, 12),), target="GB200", num_gpu=1024, kernels=False)
    assert {w.filename for w in caught} == {__file__}           # the warning names the user's line
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xg.compile(MyTorchModel().eval(), (torch.randn(3, 12),), target="GB200", num_gpu=1, kernels=False)
