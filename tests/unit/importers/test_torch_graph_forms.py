"""Graph forms torch.export gives ordinary models that the importer translates rather than
refuses: higher-order `wrap_*` ops (`torch.set_grad_enabled` and `torch.autocast` regions, inlined
from their subgraphs) and in-place ATen ops (translated as their functional form, the written
tensor rebound). Each checked against eager; where the translation would be wrong, a clear error."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import xg


def close(engine, model, *inputs) -> bool:
    with torch.no_grad():
        want = model(*inputs)
    return torch.allclose(engine(*inputs), want, rtol=1e-5, atol=1e-6)


def captured_graph_translates(model: nn.Module, *inputs) -> bool:
    """Whether the graph torch.export gives translates as it is: the retry on the decomposed
    graph (which inlines higher-order ops and removes in-place ones) would hide what is tested."""
    from xgbuild.compiler.importers.torch_export import _Translator
    ep = torch.export.export(model, inputs, strict=False)
    t = _Translator(ep, type(model).__name__, [f"x{i}" for i in range(len(inputs))], {})
    t.run()
    return not t.unsupported


def hops(model: nn.Module, *inputs) -> set[str]:
    ep = torch.export.export(model, inputs, strict=False)
    return {n.target.__name__ for n in ep.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)}


# --- higher-order ops -------------------------------------------------------------------------
class GradRegion(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        with torch.set_grad_enabled(False):
            a, b = self.fc(x).sin(), x * 2
        return a + b


class AutocastOff(nn.Module):
    """As transformers' rotary embeddings: float32 math kept out of an autocast region."""

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            y = x.float() @ x.float().transpose(0, 1)
        return y.cos()


class Nested(nn.Module):
    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            with torch.set_grad_enabled(False):
                y = x.exp()
            z = y * x
        return z - 1


@pytest.mark.parametrize("model, hop", [(GradRegion(), "wrap_with_set_grad_enabled"),
                                        (AutocastOff(), "wrap_with_autocast"),
                                        (Nested(), "wrap_with_autocast")])
def test_wrap_ops_are_inlined(model, hop) -> None:
    x = torch.randn(4, 6)
    assert hop in hops(model.eval(), x)                  # the graph really holds the op
    assert captured_graph_translates(model, x)
    engine = xg.compile(model, (x,), kernels=False)
    assert not any(n.op.value == "extern" for n in engine.engine.graph.nodes)
    x = torch.randn(4, 6)
    assert close(engine, model, x)


def test_an_enabled_autocast_region_takes_the_decomposed_graph() -> None:
    class AutocastOn(nn.Module):
        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = x @ x.T
            return y.float()
    x = torch.randn(4, 4)
    engine = xg.compile(AutocastOn(), (x,), kernels=False)      # its casts are explicit there
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = AutocastOn()(x)
    assert torch.allclose(engine(x), want)


class Cond(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))


@pytest.mark.parametrize("fallback", ["error", "eager"])
def test_a_higher_order_op_xg_cannot_inline_is_a_clear_unsupported_entry(fallback) -> None:
    with pytest.raises(xg.CompileError, match=r"torch.ops.higher_order.cond at Cond \(top level\): the higher-order "
                                              r"op `cond` is not one XG can inline"):
        xg.compile(Cond(), (torch.randn(3),), kernels=False, fallback=fallback)


def test_unsupported_ops_inside_a_region_fall_back_to_eager() -> None:
    class Region(nn.Module):
        def forward(self, x):
            with torch.set_grad_enabled(False):
                y = torch.cumprod(x, dim=-1)
            return y + 1
    x = torch.randn(3, 5)
    with pytest.raises(xg.CompileError, match=r"aten.cumprod at Region \(top level\)"):
        xg.compile(Region(), (x,), kernels=False)
    with pytest.warns(UserWarning, match="aten.cumprod"):
        engine = xg.compile(Region(), (x,), kernels=False, fallback="eager")
    assert close(engine, Region(), x)


def test_llama_without_no_grad_has_no_higher_order_op_left() -> None:
    """Llama's rotary embedding runs under torch.autocast(enabled=False) and, outside no_grad,
    torch.export wraps it in wrap_with_set_grad_enabled: both inlined, whatever else is missing."""
    from hf_zoo import build, output, reference, rel_err
    hf = build("llama")
    kw = hf.inputs(2, 16)
    try:
        engine = xg.compile(hf.model, example_kwargs=kw, kernels=False)
    except xg.CompileError as err:
        text = str(err)
        assert "higher_order" not in text and "get_attr" not in text and "wrap_with" not in text, text
        return
    assert rel_err(output(engine(**kw)), reference(hf.model, kw)) < 1e-4


# --- in-place ops -----------------------------------------------------------------------------
class Bias(nn.Module):
    """In-place ops on intermediates, each read afterwards through the written tensor and
    through the op's result: `add_` (as T5's position bias), chained `mul_`, `masked_fill_`,
    `relu_` (which the table also has in-place)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        h = self.fc(x)
        r = h.add_(1.0)
        h.mul_(2.0).mul_(x)
        h.masked_fill_(x > 0.5, -1.0)
        g = (h * 3).relu_()
        return h + r + g


def test_inplace_ops_on_intermediates_match_eager() -> None:
    model, x = Bias().eval(), torch.randn(4, 5)
    ops = {str(n.target) for n in torch.export.export(model, (x,), strict=False).graph.nodes}
    assert {"aten.add_.Tensor", "aten.mul_.Tensor", "aten.masked_fill_.Scalar"} <= ops
    assert captured_graph_translates(model, x)
    engine = xg.compile(model, (x,), kernels=False)
    x = torch.randn(4, 5)
    assert close(engine, model, x)


def test_an_inplace_op_without_translation_falls_back_to_its_functional_form() -> None:
    class Floor(nn.Module):
        def forward(self, x):
            y = x * 4
            y.floor_()
            return y + x
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="aten.floor_"):
        engine = xg.compile(Floor(), (x,), kernels=False, fallback="eager")
    assert any(n.attr("call") == "aten.floor.default" for n in engine.engine.graph.nodes
               if n.op.value == "extern")
    assert close(engine, Floor(), x)


def test_a_write_into_a_view_is_exact_or_refused() -> None:
    """`h[:, :2].mul_(2)` changes `h`: rebinding only the view would be wrong, so the captured
    graph refuses it and the decomposed (functional) graph is used."""
    class ViewWrite(nn.Module):
        def forward(self, x):
            h = x + 1
            h[:, :2].mul_(2.0)
            return h
    x = torch.randn(3, 4)
    assert not captured_graph_translates(ViewWrite(), x)
    try:                                    # exact once the decomposed graph's ops all translate
        engine = xg.compile(ViewWrite(), (x,), kernels=False)
    except xg.CompileError as err:
        assert "aten.mul_ at ViewWrite (top level): it writes in place into storage that `add` shares" in str(err)
        return
    assert close(engine, ViewWrite(), x)


def test_the_alias_check_refuses_a_view_read_after_the_write() -> None:
    from xgbuild.compiler.importers.builder import TranslationError
    from xgbuild.compiler.importers.torch_inplace import Aliases

    class ViewRead(nn.Module):
        def forward(self, x):
            h = x + 1
            v = h.view(-1)
            h.add_(1.0)
            return v * 2
    graph = torch.export.export(ViewRead(), (torch.randn(2, 3),), strict=False).graph
    add_ = next(n for n in graph.nodes if str(n.target) == "aten.add_.Tensor")
    with pytest.raises(TranslationError, match="storage that `view` shares and is read after the write"):
        Aliases(graph).written(add_)


def test_writing_into_a_model_input_is_refused() -> None:
    class Writes(nn.Module):
        def forward(self, x):
            x.add_(1.0)
            return x * 2
    with pytest.raises(xg.CompileError, match=r"aten.add_ at Writes \(top level\): it writes in place into `x`, an "
                                              r"input of the graph"):
        xg.compile(Writes(), (torch.randn(3),), kernels=False)


def test_writing_into_a_buffer_is_refused() -> None:
    class Counts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x):
            self.seen.add_(x)
            return x * 2
    with pytest.raises(xg.CompileError, match=r"aten.add_ at Counts \(top level\): it writes in place into `b_seen`"):
        xg.compile(Counts().eval(), (torch.randn(3),), kernels=False)
