"""Attention differentiated flash-style (passes/flash.py, ops/attention.py, templates/flash.py):
which programs get the recomputing gradient, its values against torch.autograd in float64, its
kernels under Triton's interpreter (interpret_flash.py) at several block shapes, and what it
saves in a GPT-2-small training step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from interpreted import interpreted_report  # noqa: E402

SHARP_TOL = 2e-2

HEAD = """extern Tensor[float64, B, T, D] Q
extern Tensor[float64, B, S, D] K
extern Tensor[float64, B, S, E] V
extern Tensor[float64, B, T, E] G
"""
FN = """def f(Tensor[float64, B, T, D] q, Tensor[float64, B, S, D] k, Tensor[float64, B, S, E] v,
      Tensor[float64, B, T, E] g) -> float64 {{
    keep = reshape(arange(T), [T, 1]) >= reshape(arange(S), [1, S])
    {body}
}}
def main() {{
    return grad(f, wrt=(q, k, v))(Q, K, V, G)
}}
"""


def _compile(body: str):
    return compile_source(HEAD + FN.format(body=body)).optimized.main


def _grads(graph, inputs: dict) -> list[torch.Tensor]:
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in inputs.items()}))
    got = CpuExecutor(float64=True, check=False).run(sg, inputs).values
    return [got[i] for i in tree_ids(sg.output)]


@pytest.mark.parametrize("body,scale,fill", [
    ("return sum(softmax(where(keep, (q @ transpose(k)) * 0.125, -1e9), dim=2) @ v * g)", 0.125, -1e9),
    ("return sum(softmax(where(keep, (q @ transpose(k)) * 0.125, -0.5), dim=2) @ v * g)", 0.125, -0.5),
    ("return sum(softmax(q @ transpose(k), dim=2) @ v * g)", 1.0, None),
    ("return sum(softmax(0.3 * (q @ transpose(k)), dim=2) @ v * g)", 0.3, None),
], ids=["causal", "causal_near_fill", "plain", "scale_first"])
@pytest.mark.parametrize("t,s", [(9, 9), (12, 7)])
def test_gradients_match_torch_in_float64(body: str, scale: float, fill, t: int, s: int) -> None:
    g = _compile(body)
    assert sum(n.op is Op.ATTN_GRAD for n in g.nodes) == 3 and not any(n.op is Op.SOFTMAX for n in g.nodes[-40:]
                                                                      if n.attr("remat"))
    gen = torch.Generator().manual_seed(t * 100 + s)
    x = {"Q": torch.randn(2, t, 5, generator=gen, dtype=torch.float64),
         "K": torch.randn(2, s, 5, generator=gen, dtype=torch.float64),
         "V": torch.randn(2, s, 3, generator=gen, dtype=torch.float64),
         "G": torch.randn(2, t, 3, generator=gen, dtype=torch.float64)}
    q, k, v = (x[n].clone().requires_grad_() for n in "QKV")
    scores = (q @ k.transpose(1, 2)) * scale
    if fill is not None:
        keep = torch.arange(s)[None, :] <= torch.arange(t)[:, None]
        scores = torch.where(keep, scores, torch.tensor(fill, dtype=torch.float64))
    (torch.softmax(scores, 2) @ v * x["G"]).sum().backward()
    for have, want in zip(_grads(g, x), (q.grad, k.grad, v.grad)):
        assert float((have - want).norm() / want.norm()) < 1e-12


@pytest.mark.parametrize("body", [
    # the probabilities have another reader
    "p = softmax((q @ transpose(k)) * 0.125, dim=2)\n    return sum(p @ v * g) + sum(p)",
    # a mask read from memory (not a causal comparison of IOTAs)
    "return sum(softmax(where(q @ transpose(k) > 0.0, q @ transpose(k), -1e9), dim=2) @ v * g)",
    # the mask outside the scale: masked keys score fill * scale
    "return sum(softmax(where(keep, q @ transpose(k), -1e9) * 0.125, dim=2) @ v * g)",
    # the softmax over the queries
    "return sum(softmax(q @ transpose(k), dim=1) @ v * g)",
])
def test_other_forms_keep_the_op_by_op_gradient(body: str) -> None:
    g = _compile(body)
    assert not any(n.op in (Op.ATTN_GRAD, Op.ATTN_LSE) for n in g.nodes)


def test_kernels_match_the_reference_at_several_block_shapes() -> None:
    report = interpreted_report(Path(__file__).parent / "interpret_flash.py")
    assert len(report) == 4 * 2 * 3 + 4 + 4 * 3
    # A fused qkv projection's gradient: dk and dv's kernel writes the heads' three gradients into
    # their slots of [B, T, 3, H, DH] (dq copied in), no element-wise kernel places them.
    for key in [k for k in report if k.startswith("placed_")]:
        r = report.pop(key)
        assert r["kernels"] == ["attn_lse", "k+v+unindex+unindex+unindex", "q"] and r["placing"] == 0, (key, r)
        assert r["rel_err"] < (3e-2 if "bf16" in key else 1e-5), (key, r)
    # Its output's heads merged for a product and read by the delta too (passes/merge_heads.py):
    # the attention kernel writes only the merged heads, the delta reads them back through strides.
    for key in [k for k in report if k.startswith("merged_")]:
        r = report.pop(key)
        assert r["merged"] == [True] and r["kernels"] == ["attn_lse", "k+v+unindex+unindex+unindex", "sum+q"], (key, r)
        assert r["rel_err"] < (3e-2 if "bf16" in key else 1e-5), (key, r)
    # dO a product's: dq's kernel computes each row's delta (writing it for dk and dv when they
    # read it); without dq the delta stays a row kernel of its own.
    for key, grads, kernels, tol in (("q_only_bf16", 1, ["attn_lse", "sum+q"], 3e-2),
                                     ("qkv_product_f32", 3, ["attn_lse", "k+v", "sum+q"], 1e-5),
                                     ("kv_only_f32", 2, ["attn_lse", "k+v"], 1e-5)):
        r = report.pop(f"{key} T70 S70 64x32")
        assert r["flash_grads"] == grads and r["kernels"] == kernels and r["rel_err"] < tol, (key, r)
    # Scores far apart (bfloat16's spacing there is 0.25): kept float32, the gradients are 8.1e-3
    # off (under the interpreter, rounding to nearest as a GPU: runtime/interpret.py); the backward
    # kernels' scores rounded to the product's dtype, 0.13.
    r = report.pop("sharp_bf16 T70 S70 64x32")
    assert r["kernels"] == ["attn_lse", "k+v", "q"] and r["rel_err"] < SHARP_TOL, r
    for key, r in report.items():
        assert r["flash_grads"] == 3, key
        # dk and dv in one kernel, beside dq's (the delta's row kernel computes dO's ops too); the
        # forward attention kernel writes the log-sum-exp.
        assert r["kernels"] == ["attn_lse", "k+v", "q"], (key, r)
        assert r["rel_err"] < (3e-2 if "bf16" in key else 1e-5), (key, r)


def test_the_training_step_keeps_no_attention_probabilities() -> None:
    """models/train.xg at GPT-2-small size: no [B, H, T, T] value made by a kernel, and the kernel
    outputs alive at once under 8.8 GB (torch.compile's measured peak for the same step on an H200)."""
    from xgbuild.compiler.codegen.launch_abi import ExternStep
    from xgbuild.runtime.lifetimes import frees, peak_bytes
    from xgbuild.runtime.native import made_by
    from xgbuild.tuner.jobs import plan, tuning_env

    class _Plan:
        def __init__(self, binding) -> None:
            self.binding = binding
    repo = Path(__file__).resolve().parents[3]
    graph = compile_source((repo / "models" / "train.xg").read_text(), "train.xg").optimized.main
    _jobs, launches = plan(graph, tuning_env(graph, {}))
    plans = [ExternStep(b) if ident == "extern" else _Plan(b) for ident, b in launches]
    written = {nid for p in plans if not isinstance(p, ExternStep) for nid in p.binding.outputs}
    assert not [nid for nid in written if tuple(graph.node(nid).shape)[-2:] == (1024, 1024)]
    made = made_by(plans)
    assert peak_bytes(graph, plans, made, frees(graph, plans, made)) < 8.8e9


def _placing(src: str) -> tuple[list, list]:
    """(the flash kernels' written shapes, the element-wise kernels that place unindexed values)."""
    from xgbuild.compiler.codegen.schedule import schedule
    g = compile_source(src, "placed.xg").optimized.main
    s = schedule(g)
    flash = sorted(tuple(g.node(o).shape) for k in s.kernels if k.kind == "flash" for o in s.outputs(k))
    placing = [k for k in s.kernels if k.kind == "elementwise" and any(g.node(i).op is Op.UNINDEX for i in k.nodes)]
    return flash, placing


def test_the_heads_gradients_are_written_into_their_qkv_slots() -> None:
    """A fused qkv projection's gradient: dk and dv's kernel writes [B, T, 3, H, DH] (dq's kernel
    writes dq and the delta); nothing else places them. Values: test_kernels_match_the_reference_at_
    several_block_shapes ("placed_*")."""
    from interpret_flash import PLACED
    flash, placing = _placing(PLACED.format(dt="bfloat16"))
    assert flash == [(2, 3, 40, 8), (2, 40, 3, 3, 8)] and placing == []


@pytest.mark.parametrize("change", [
    # q from a tensor of its own: two slots of three would be the kernel's, the third an input's.
    ("q = heads(qkv[:, 0:D])", "q = heads(qkv[:, 0:D] * cast(2.0, {dt}))"),
    # 32 keys for 40 queries, sliced after the heads: dk and dv reach their slots through a slice
    # (and the kernel's key blocks could not copy dq's 40 rows).
    ("k = heads(qkv[:, D:2 * D])", "k = heads(qkv[:, D:2 * D])[:, :, 0:32]"),
])
def test_other_placements_keep_their_element_wise_kernel(change) -> None:
    from interpret_flash import PLACED
    src = PLACED.replace(*change).format(dt="bfloat16")
    if "0:32" in change[1]:
        src = src.replace("v = heads(qkv[:, 2 * D:D3])", "v = heads(qkv[:, 2 * D:D3])[:, :, 0:32]") \
            .replace("reshape(arange(T), [1, T])", "reshape(arange(32), [1, 32])")
    flash, placing = _placing(src)
    assert (2, 40, 3, 3, 8) not in flash and [tuple(k.shape) for k in placing].count((2, 40, 3, 3, 8)) == 1
