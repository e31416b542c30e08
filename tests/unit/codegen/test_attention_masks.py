"""Attention under the masks `transformers` builds (causal and padding and-ed into one boolean
tensor): one causal flash kernel that computes the causal half from its indices, skips the blocks
above the diagonal and reads the padding as a vector; and a query the mask leaves no key gives
zeros (a safe softmax), as PyTorch's attention does, with no pass over the mask after it."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import xg
from xgbuild.compiler.ir.graph import Op

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402
from interpret_sdpa import MaskedAttention, inputs  # noqa: E402


def test_masked_sdpa_is_one_causal_kernel_and_matches_float64_under_the_interpreter() -> None:
    report = interpreted_report(HERE / "interpret_sdpa.py")
    assert report["kinds"].count("attention") == 1 and "rowwise" not in report["kinds"]
    assert report["causal"] == [True]                      # the causal half: computed, blocks skipped
    # q, k, v and the padding (read along the keys); no [B, 1, T, S] mask tensor
    assert [o[0] for o in report["operands"][0]].count("bool") == 1
    (out,) = report["outputs"]
    assert out["rel_err"] < 1e-5, out
    # grouped-query attention (transformers' repeat_kv): the same one causal kernel, reading each key
    # head in place for its group of query heads; no kernel writes the repeated keys and values
    gqa = report["gqa"]
    assert gqa["kinds"] == report["kinds"] and gqa["causal"] == [True], gqa
    assert gqa["operands"] == report["operands"]
    (out,) = gqa["outputs"]
    assert out["rel_err"] < 1e-5, out


def test_a_query_with_no_key_gives_zeros_as_torch_does() -> None:
    q, k, v, pad = inputs(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(MaskedAttention(), (q, k, v, pad), target="H100", tune="predict", kernels=False)
    g = engine.engine.graph
    (sm,) = [n for n in g.nodes if n.op is Op.SOFTMAX]
    assert sm.attr("safe") is True
    # nothing reduces the mask after the attention any more
    assert not any(n.op in (Op.MAX, Op.NOT) for n in g.nodes)
    fresh = inputs(4)
    got = xg.run_engine(engine.engine, dict(zip(("q", "k", "v", "pad"), fresh))).tensors["out"].double()
    ref = MaskedAttention()(*(t.double() if t.is_floating_point() else t for t in fresh))
    T = q.shape[-2]
    assert torch.equal(got[0, :, : T // 2], torch.zeros_like(got[0, :, : T // 2]))
    assert torch.equal(ref[0, :, : T // 2], torch.zeros_like(ref[0, :, : T // 2]))
    assert float((got - ref).norm() / ref.norm()) < 1e-6


def test_safe_softmax_is_imported_with_torchs_meaning() -> None:
    class Safe(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten._safe_softmax(x, -1)
    x = torch.randn(3, 5, 7)
    x[1, 2] = float("-inf")
    x[0, :, :3] = float("-inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(Safe(), (x,), target="H100", tune="predict", kernels=False)
    y = torch.randn(3, 5, 7)
    y[2, 4] = float("-inf")
    got = xg.run_engine(engine.engine, {"x": y}).tensors["out"].double()
    ref = torch.ops.aten._safe_softmax(y.double(), -1)
    assert torch.equal(got[2, 4], torch.zeros(7, dtype=torch.float64))
    assert float((got - ref).norm() / ref.norm()) < 1e-6
