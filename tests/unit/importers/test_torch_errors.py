"""What xg.compile refuses, and how: wrong inputs after compiling, unsupported ops (all of them,
with the module using each), training mode, options it does not offer."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import xg
from zoo import make


@pytest.fixture(scope="module")
def bert():
    model, inputs, _ = make("bert")
    return xg.compile(model, inputs, kernels=False), inputs


def test_wrong_count(bert) -> None:
    engine, (ids, mask) = bert
    with pytest.raises(xg.InputError, match=r"the engine takes 2 inputs \(input_ids: int64\[2, 16\], "
                                            r"attention_mask: int64\[2, 16\]\), got 1"):
        engine(ids)


def test_wrong_dtype(bert) -> None:
    engine, (ids, mask) = bert
    with pytest.raises(xg.InputError, match="input `attention_mask` has dtype float32, the engine expects int64"):
        engine(ids, mask.float())


def test_wrong_shape(bert) -> None:
    engine, (ids, mask) = bert
    with pytest.raises(xg.InputError, match=r"input `input_ids` must have shape \[2, 16\], got \[2, 12\]"):
        engine(ids[:, :12], mask)
    with pytest.raises(xg.InputError, match=r"input `attention_mask` must have rank 2 \(shape \[2, 16\]\), got shape \[32\]"):
        engine(ids, mask.reshape(-1))


def test_not_a_tensor(bert) -> None:
    engine, (ids, mask) = bert
    with pytest.raises(xg.InputError, match="input `attention_mask` is a list; the engine expects a tensor"):
        engine(ids, mask.tolist())


def test_index_out_of_range(bert) -> None:
    engine, (ids, mask) = bert
    bad = ids.clone()
    bad[1, 3] = 64
    with pytest.raises(xg.InputError, match=r"input `input_ids` holds 64, outside \[0, 64\)"):
        engine(bad, mask)


def test_dynamic_dim_mismatch() -> None:
    model, inputs, dyn = make("bert")
    engine = xg.compile(model, inputs, kernels=False, dynamic_shapes=dyn)
    ids, mask = make("bert", batch=3)[1]
    with pytest.raises(xg.InputError, match="`attention_mask` has batch = 2 .* fixed batch = 3"):
        engine(ids, mask[:2])


class Scan(nn.Module):
    def forward(self, x):
        return torch.cumprod(x, dim=0)


class Sorter(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), Scan())
        self.tail = Sorter()

    def forward(self, x):
        return self.tail(self.body(x)) + torch.cumprod(x, dim=1)


def test_every_unsupported_op_with_its_module() -> None:
    with pytest.raises(xg.CompileError) as info:
        xg.compile(Net(), (torch.randn(3, 4),), kernels=False)
    text = str(info.value)
    assert "model Net uses 2 unsupported ops" in text         # distinct ops, each listed once
    assert "aten.cumprod (2 uses) at body.1 (Scan), Net (top level)" in text
    assert "aten.sort at tail (Sorter)" in text


def test_training_mode_is_refused() -> None:
    model, inputs, _ = make("resnet")
    with pytest.raises(xg.CompileError, match=r"module `stem.1` \(BatchNorm2d\) is in training mode(.|\n)*call model.eval\(\)"):
        xg.compile(model.train(), inputs, kernels=False)


def test_dropout_in_training_mode_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    with pytest.raises(xg.CompileError, match=r"aten.dropout at 1 \(Dropout\): dropout in training mode"):
        xg.compile(model, (torch.randn(2, 4),), kernels=False)


def test_unknown_fallback_is_refused_clearly() -> None:
    with pytest.raises(xg.XGError, match="fallback must be 'error' .* or 'eager' .*, got 'python'"):
        xg.compile(nn.Linear(2, 2), (torch.randn(1, 2),), fallback="python")


def test_fallback_eager_with_nothing_to_fall_back_builds_no_eager_op() -> None:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # no "run in PyTorch eager" warning either
        engine = xg.compile(nn.Linear(2, 2), (torch.randn(1, 2),), fallback="eager", kernels=False)
    assert all(n.op.value != "extern" for n in engine.engine.graph.nodes)


@pytest.mark.parametrize("bad, message", [
    (dict(example_inputs=[1, 2]), r"example_inputs\[0\] is a int; pass tensors"),
    (dict(example_inputs=()), "example_inputs must be a non-empty tuple"),
    (dict(num_gpu=0), "num_gpu must be a positive integer"),
    (dict(target="Z80"), "Z80"),
])
def test_bad_arguments(bad, message) -> None:
    args = dict(example_inputs=(torch.randn(1, 2),), kernels=False)
    args.update(bad)
    with pytest.raises(xg.XGError, match=message):
        xg.compile(nn.Linear(2, 2), **args)


def test_uncapturable_model() -> None:
    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x
    with pytest.raises(xg.CompileError, match="torch.export could not capture the model"):
        xg.compile(DataDependent(), (torch.randn(3),), kernels=False)


def test_a_translation_bug_is_reported_like_an_unsupported_op(monkeypatch) -> None:
    """A translation that fails by XG's own bug becomes a TranslationError naming the bug (so the
    unsupported-op report or `fallback="eager"` takes it), never a traceback out of xg.compile."""
    from xgbuild.compiler.importers.aten_table import TABLE
    from xgbuild.compiler.importers.builder import TranslationError
    from xgbuild.compiler.importers.torch_export import _translate

    def broken(t, node, args, kwargs):
        return [][0]

    with pytest.raises(TranslationError, match=r"internal error in XG's translation \(IndexError: list index"):
        _translate(broken, None, None, (), {})
    monkeypatch.setitem(TABLE, "aten.relu", broken)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.warns(UserWarning, match=r"aten.relu.default at 1 \(ReLU\)"):
        engine = xg.compile(model, (torch.randn(2, 4),), kernels=False, fallback="eager")
    x = torch.randn(2, 4)
    assert torch.allclose(engine(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_dynamic_dim_the_model_constrains_says_how_to_declare_it() -> None:
    class EightRows(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[0] % 8 == 0 else x
    with pytest.raises(xg.CompileError) as info:
        xg.compile(EightRows(), (torch.randn(8, 3),), kernels=False,
                   dynamic_shapes=({0: torch.export.Dim("b", min=2, max=64)},))
    text = str(info.value)
    assert "Constraints violated (b)" in text and "% 8) == 0" in text
    assert "b = 8*_b" in text and "TORCH_LOGS" not in text
