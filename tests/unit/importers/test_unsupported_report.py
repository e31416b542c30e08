"""The unsupported-op report (XG0800): each op once, with its count and every module using it,
across the graphs tried (captured, then decomposed); and XG's own failures while importing or
building (XG0900): one line naming the exception, never a traceback."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import xg
from xgbuild.compiler.importers.imported import Unsupported, UnsupportedOps, group_unsupported


def test_each_op_once_with_count_and_modules_in_order() -> None:
    items = [Unsupported("aten.index", "BertModel (top level)"),
             Unsupported("aten.cumsum", "encoder.layer.0 (BertLayer)"),
             Unsupported("aten.index", "encoder.layer.0 (BertLayer)"),
             Unsupported("aten.index", "BertModel (top level)"),
             Unsupported("aten.index", "encoder.layer.0 (BertLayer)")]
    err = UnsupportedOps("model BertModel", items)
    text = str(err)
    assert "model BertModel uses 2 unsupported ops" in text
    assert "aten.index (4 uses) at BertModel (top level), encoder.layer.0 (BertLayer)" in text
    assert "aten.cumsum at encoder.layer.0 (BertLayer)" in text
    assert text.index("aten.index") < text.index("aten.cumsum")          # first use first
    assert err.items == items                                           # every use, for programs
    assert [(u.op, u.count) for u in err.ops] == [("aten.index", 4), ("aten.cumsum", 1)]


def test_both_graphs_counted_once_and_decomposed_only_ops_marked() -> None:
    items = [Unsupported("aten.index", "a (A)"), Unsupported("aten.index", "b (B)"),
             Unsupported("aten.index", "a (A)", graph="decomposed"),
             Unsupported("aten.any", "c (C)", graph="decomposed"),
             Unsupported("aten.any", "c (C)", graph="decomposed", why="a reason"),
             Unsupported("aten.any", "c (C)", graph="decomposed", why="a reason")]
    ops = group_unsupported(items)
    assert [u.note() for u in ops] == ["aten.index (2 uses) at a (A), b (B)",
                                       "aten.any (3 uses, after decomposition) at c (C): a reason"]


class Scan(nn.Module):
    def forward(self, x):
        return torch.cumprod(x, dim=-1)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Scan(), nn.Linear(4, 4), Scan()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return torch.cumprod(x, dim=0)


def test_a_model_report() -> None:
    with pytest.raises(xg.CompileError) as info:
        xg.compile(Stack(), (torch.randn(3, 4),), kernels=False)
    text = str(info.value)
    assert "error[XG0800]: model Stack uses 1 unsupported op\n" in text
    assert "aten.cumprod (3 uses) at layers.0 (Scan), layers.2 (Scan), Stack (top level)" in text
    assert isinstance(info.value, UnsupportedOps) and len(info.value.ops) == 1


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "File \"" not in text


def test_an_xg_bug_while_importing_is_one_internal_error(monkeypatch) -> None:
    from xgbuild.compiler.importers import torch_export

    def broken(self):
        raise KeyError("no such node")
    monkeypatch.setattr(torch_export._Translator, "run", broken)
    with pytest.raises(xg.CompileError) as info:
        xg.compile(nn.Linear(2, 2), (torch.randn(1, 2),), kernels=False)
    text = str(info.value)
    first = text.splitlines()[0]
    assert first.startswith("error[XG0900]: internal compiler error: XG failed while importing the PyTorch model "
                            "(KeyError: 'no such node'); traceback written to ")
    _no_traceback(text)
    dump = first.rsplit(" ", 1)[-1]
    with open(dump) as f:
        assert "KeyError" in f.read()


def test_an_xg_bug_while_building_is_one_internal_error(monkeypatch) -> None:
    from xgbuild.build import engines

    def broken(*args, **kwargs):
        raise RuntimeError("packager fell over")
    monkeypatch.setattr(engines, "model_engine", broken)
    with pytest.raises(xg.CompileError, match=r"XG0900.*building the model's engine \(RuntimeError: packager fell "
                                              r"over\)") as info:
        xg.compile(nn.Linear(2, 2), (torch.randn(1, 2),), kernels=False)
    _no_traceback(str(info.value))


def test_user_errors_stay_user_errors() -> None:
    """Only XG's own exceptions become internal errors: a model torch.export cannot capture is
    still XG0805, a bad argument still its own message."""
    class Raises(nn.Module):
        def forward(self, x):
            raise ValueError("the model's own bug")
    with pytest.raises(xg.CompileError, match="XG0805.*ValueError: the model's own bug"):
        xg.compile(Raises(), (torch.randn(2),), kernels=False)
    with pytest.raises(xg.XGError, match="example_inputs must be a tuple"):
        xg.compile(nn.Linear(2, 2), 3, kernels=False)
