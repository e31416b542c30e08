"""merge-heads (passes/merge_heads.py): an attention output read by its merge chain and by fusable
readers is read back from the merged heads, so the attention kernel writes only those; the values
are the same bit for bit. Under Triton's interpreter: tests/unit/codegen/test_flash.py ("merged_*")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import xgbuild.compiler.passes.pipeline as pipeline
from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.codegen.templates import template
from xgbuild.compiler.driver import compile_file, compile_source
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.runtime.cpu import CpuExecutor

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit" / "codegen"))
from interpret_flash import MERGED  # noqa: E402

SMALL = {"L": 2, "D": 64, "H": 2, "T": 32, "V": 128, "B": 2}


def _without_pass(monkeypatch) -> None:
    monkeypatch.setattr(pipeline, "PIPELINE", [(n, f) for n, f in pipeline.PIPELINE if n != "merge-heads"])


def _attention_writes(graph) -> list[bool]:
    s = schedule(graph)
    return [template("attention").spec(s, k)[0].strided_out for k in s.kernels if k.kind == "attention"]


def _head_copies(graph) -> int:
    """Kernels that only cast values of the heads' merged shape [B, T, H, DH] (the round trip a
    precision policy leaves between the attention and its output projection)."""
    heads = (SMALL["B"], SMALL["T"], SMALL["H"], SMALL["D"] // SMALL["H"])
    return sum(1 for k in schedule(graph).kernels if k.kind == "elementwise" and tuple(k.shape) == heads
               and all(graph.node(i).op is Op.CAST for i in k.nodes))


@pytest.mark.parametrize("compute,saved", [("bfloat16", SMALL["L"]), ("float32", 0)])
def test_training_step_writes_merged_heads(compute: str, saved: int, monkeypatch) -> None:
    """models/train.xg (small): every layer's attention kernel writes the merged heads the output
    projection reads (its product then reads a dense operand), and the delta reads them back. Under
    the bf16 policy a cast-cast copy a layer goes with it; in float32 the product had read the
    heads through strides, and the kernel count stays."""
    consts = {**SMALL, "COMPUTE": compute}
    g = compile_file(REPO / "models" / "train.xg", CheckOptions(consts=consts)).optimized.main
    assert _attention_writes(g) == [True] * SMALL["L"]
    assert _head_copies(g) == 0
    _without_pass(monkeypatch)
    before = compile_file(REPO / "models" / "train.xg", CheckOptions(consts=consts)).optimized.main
    assert _attention_writes(before) == [False] * SMALL["L"]
    assert _head_copies(before) == saved
    assert len(schedule(before).kernels) - len(schedule(g).kernels) == saved


def _values(graph, inputs: dict) -> list[torch.Tensor]:
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in inputs.items()}))
    got = CpuExecutor(float64=False, check=False).run(sg, inputs).values
    return [got[i] for i in tree_ids(sg.output)]


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
def test_values_are_unchanged_bit_for_bit(dt: str, monkeypatch) -> None:
    """The rewritten graph computes what the graph before it did, in the program's own dtypes:
    views read the same elements and the dropped round trip is exact."""
    src = MERGED.format(dt=dt)
    g = compile_source(src, "merged.xg").optimized.main
    gen = torch.Generator().manual_seed(7)
    tdt = getattr(torch, dt)
    inputs = {"X": torch.randn(80, 72, generator=gen).to(tdt), "WO": (0.2 * torch.randn(24, 24, generator=gen)).to(tdt),
              "G": torch.randn(80, 24, generator=gen)}
    _without_pass(monkeypatch)
    before = compile_source(src, "merged.xg").optimized.main
    assert _attention_writes(g) == [True] and _attention_writes(before) == [False]
    for a, b in zip(_values(g, inputs), _values(before, inputs), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


OTHERS = """extern Tensor[float32, 2, 4, 16, 8] Q
extern Tensor[float32, 2, 4, 16, 8] K
extern Tensor[float32, 2, 4, 16, 8] V
extern Tensor[float32, 32, 8] W
extern Tensor[float32, 8, 8] M
def main() {{
    o = softmax((Q @ transpose(K)) * 0.35, dim=3) @ V
    {body}
}}
"""


@pytest.mark.parametrize("body,merged", [
    # read by a reduction too: it reads the merged heads back
    ("return (reshape(transpose(o, 1, 2), [2, 16, 32]) @ W, sum(o * 2.0, dim=3))", True),
    # read by a product too: a product may not take any view, so o stays written as it is
    ("return (reshape(transpose(o, 1, 2), [2, 16, 32]) @ W, o @ M)", False),
    # o itself an output
    ("return (reshape(transpose(o, 1, 2), [2, 16, 32]) @ W, o)", False),
    # no merge (a permutation alone is a view)
    ("return (transpose(o, 1, 2) * 3.0, sum(o, dim=3))", False),
], ids=["reduction", "product", "output", "no_merge"])
def test_which_other_readers_move(body: str, merged: bool) -> None:
    g = compile_source(OTHERS.format(body=body)).optimized.main
    assert _attention_writes(g) == [merged]
    gen = torch.Generator().manual_seed(3)
    inputs = {n: torch.randn(*s, generator=gen) for n, s in (("Q", (2, 4, 16, 8)), ("K", (2, 4, 16, 8)),
                                                           ("V", (2, 4, 16, 8)), ("W", (32, 8)), ("M", (8, 8)))}
    q, k, v = inputs["Q"].double(), inputs["K"].double(), inputs["V"].double()
    o = torch.softmax((q @ k.transpose(-1, -2)) * 0.35, dim=3) @ v
    got = _values(g, inputs)
    first = o.transpose(1, 2).reshape(2, 16, 32) @ inputs["W"].double() if "@ W" in body else o.transpose(1, 2) * 3
    assert torch.allclose(got[0].double(), first, rtol=1e-5, atol=1e-6)
