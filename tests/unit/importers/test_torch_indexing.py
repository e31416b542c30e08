"""The indexing, padding, scan, boolean and convolution ops of transformers' models (issue 20):
each against float64 eager on fresh inputs, each gather a GATHER (never a selection matmul), the
kernels of all of them run under Triton's interpreter, and what XG refuses is refused clearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xg
from indexing_cases import CASES, fresh
from xgbuild.compiler.importers.imported import UnsupportedOps
from xgbuild.compiler.importers.torch_export import import_torch
from xgbuild.compiler.ir.graph import Op
from zoo import TOL, rel_err

HERE = Path(__file__).resolve().parent


def _reference(fn, inputs):
    import indexing_cases as cases
    saved = {k: v for k, v in vars(cases).items() if isinstance(v, torch.Tensor)}
    for k, v in saved.items():
        setattr(cases, k, v.double())
    try:
        return fn(*(x.double() if x.is_floating_point() else x for x in inputs))
    finally:
        for k, v in saved.items():
            setattr(cases, k, v)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name: str) -> None:
    fn, inputs = CASES[name]
    engine = xg.compile(fn, inputs, kernels=False)
    for trial in range(2):
        values = fresh(inputs)
        got, ref = engine(*values), _reference(fn, values)
        assert got.shape == ref.shape
        if ref.dtype in (torch.bool, torch.int64):
            assert got.dtype == ref.dtype and torch.equal(got, ref), name
        else:
            assert rel_err(got, ref) < TOL, f"{name}: {rel_err(got, ref):.2e}"


@pytest.mark.parametrize("name", ["index_select_dim1", "gather_dim1", "index_two_tensors", "pad_reflect_2d",
                                  "cat_int_bool", "pad_constant_value"])
def test_gathers_and_placements_are_not_matmuls(name: str) -> None:
    fn, inputs = CASES[name]
    ops = [n.op for n in import_torch(fn, inputs).optimized.main.nodes]
    assert Op.MATMUL not in ops
    assert Op.GATHER in ops or Op.UNINDEX in ops


def test_kernels_match_reference_under_interpreter() -> None:
    """Every case's GPU kernels (as an engine carries them), run by Triton's interpreter."""
    proc = subprocess.run([sys.executable, str(HERE / "interpret_cases.py")], capture_output=True, text=True,
                          timeout=900, cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == set(CASES)
    for name, outs in report.items():
        assert outs, name
        for out in outs:
            assert out["rel_err"] < TOL, f"{name}: output %{out['node']} {out['rel_err']:.2e}"


def test_dynamic_sequence_gathers_and_scans() -> None:
    """A mask pipeline over a symbolic sequence: cumsum, diff with prepend, a cat along the symbolic
    dim and a slice of a buffer to it, specialised at two lengths."""
    class Masks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", torch.arange(64))

        def forward(self, mask, x):
            pos = torch.cumsum(mask, dim=1) * mask
            d = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
            y = torch.cat([x[:, :1], x], dim=1)[:, 1:] * (d != 1).unsqueeze(-1)
            return y + self.buf[: x.shape[1]].unsqueeze(-1)
    fn = Masks()
    seq = torch.export.Dim("seq", min=2, max=32)
    mask, x = torch.randint(0, 2, (2, 8)), torch.randn(2, 8, 3)
    engine = xg.compile(fn, (mask, x), kernels=False, dynamic_shapes=({1: seq}, {1: seq}))
    for n in (5, 11):
        m, v = torch.randint(0, 2, (2, n)), torch.randn(2, n, 3)
        with torch.no_grad():
            assert rel_err(engine(m, v), fn(m, v.double())) < TOL


@pytest.mark.parametrize("fn, inputs, reason", [
    (lambda a, b: a & b, (torch.randint(0, 9, (3,)), torch.randint(0, 9, (3,))), "bitwise"),
    (lambda x, m: x[m], (torch.randn(4, 3), torch.rand(4) > 0.5), "aten.index"),
    (lambda x: F.pad(x, (1, 1), mode="circular"), (torch.randn(1, 2, 5),), "circular"),
    (lambda x, w: F.conv_transpose1d(x, w), (torch.randn(1, 2, 5), torch.randn(2, 3, 3)), "conv"),
    (lambda x, p: torch.pow(x, p), (torch.randn(4), torch.randn(4)), "a positive constant base"),
], ids=["bitwise_int", "bool_mask_index", "circular_pad", "conv_transpose", "pow_tensor_base"])
def test_refused_with_a_reason(fn, inputs, reason: str) -> None:
    with pytest.raises((UnsupportedOps, xg.CompileError)) as info:
        xg.compile(fn, inputs, kernels=False)
    assert reason in str(info.value)
    assert "Traceback" not in str(info.value)


def test_random_draws_only_where_eval_mode_discards_them() -> None:
    class LayerDrop(torch.nn.Module):
        """Wav2Vec2's encoder: a coin drawn per layer, used only in training."""

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x):
            p = torch.rand([])
            skip = self.training and p < 0.1
            return x if skip else self.layer(x)
    model = LayerDrop().eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert rel_err(xg.compile(model, (x,), kernels=False)(x), model.double()(x.double())) < TOL
    with pytest.raises(UnsupportedOps, match="draws random numbers"):
        xg.compile(lambda x: x + torch.rand(x.shape), (x,), kernels=False)
