"""`xg.compile(..., fallback="eager")`: ops with no translation run through PyTorch between XG's kernels.

Without it the same model is one error listing every such op; with it, one warning lists them, the
engine matches eager (CPU executor, kernels under Triton's interpreter, a saved engine in xgrun),
specialises per batch size, and refuses what it cannot call (a size that depends on a dynamic dim)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import xg
from xgbuild.compiler.importers.imported import UnsupportedOps
from xgbuild.errors import ExecutionError, XGError
from xgbuild.runtime.extern import resolve

ROOT = Path(__file__).resolve().parents[3]

MODEL = textwrap.dedent("""
    import torch

    class Ranker(torch.nn.Module):
        '''A linear layer, then ops XG has no translation for: cumprod, topk (two outputs), flip.'''
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, x):
            h = torch.cumprod(self.proj(x), dim=-1)
            top, idx = torch.topk(h, 4, dim=-1)
            return self.head(torch.relu(top)), torch.flip(h, [1]) * 0.5, idx
""")
namespace: dict = {}
exec(compile(MODEL, "ranker", "exec"), namespace)
Ranker = namespace["Ranker"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def compiled(dynamic: bool = False):
    torch.manual_seed(0)
    model = Ranker().eval()
    x = torch.randn(4, 16)
    dyn = ({0: torch.export.Dim("batch", min=1, max=64)},) if dynamic else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = xg.compile(model, (x,), tune="predict", fallback="eager", dynamic_shapes=dyn)
    return model, engine, [str(w.message) for w in caught if "fallback" in str(w.message)]


def test_without_fallback_every_op_is_listed() -> None:
    with pytest.raises(UnsupportedOps) as err:
        xg.compile(Ranker().eval(), (torch.randn(4, 16),), tune="predict")
    text = str(err.value)
    assert "3 unsupported ops" in text
    for op in ("aten.cumprod", "aten.topk", "aten.flip"):
        assert op in text


def test_eager_fallback_matches_pytorch() -> None:
    model, engine, warned = compiled()
    assert len(warned) == 1
    for op in ("aten.cumprod.default", "aten.topk.default", "aten.flip.default"):
        assert op in warned[0]
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(7))
    got = engine(x)
    with torch.no_grad():
        ref = Ranker.forward(model.double(), x.double())
    assert rel(got[0], ref[0]) < 1e-5 and rel(got[1], ref[1]) < 1e-5
    assert got[2].dtype == torch.int64 and torch.equal(got[2], ref[2])


def test_dynamic_batch_specialises_per_size() -> None:
    model, engine, _ = compiled(dynamic=True)
    for batch in (1, 9):
        x = torch.randn(batch, 16, generator=torch.Generator().manual_seed(batch))
        got = engine(x)
        with torch.no_grad():
            ref = model(x)
        assert got[0].shape == (batch, 3) and rel(got[0], ref[0]) < 1e-5
        assert torch.equal(got[2], ref[2])


def test_saved_engine_runs_in_xgrun_and_inspect_lists_eager_ops(tmp_path: Path) -> None:
    _, engine, _ = compiled()
    engine.save(tmp_path / "ranker.xge")
    bin_dir = Path(sys.executable).parent
    refused = subprocess.run([str(bin_dir / "xgrun"), str(tmp_path / "ranker.xge"), "--seed", "3"],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "--allow-fallback" in refused.stderr, refused.stderr
    run = subprocess.run([str(bin_dir / "xgrun"), str(tmp_path / "ranker.xge"), "--seed", "3", "--json",
                          "--allow-fallback"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["outputs"]["out_2"]["dtype"] == "int64"
    shown = subprocess.run([str(bin_dir / "xgbuild"), "inspect", str(tmp_path / "ranker.xge")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "aten.topk.default" in shown.stdout and "eager ops" in shown.stdout


def test_kernels_and_eager_ops_interleave_under_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(MODEL + textwrap.dedent("""
        import json, sys
        from xgbuild.build.interpreted import check_graph
        from xgbuild.runtime import interpret
        interpret.enable()
        from xgbuild.compiler.importers.torch_export import import_torch
        torch.manual_seed(0)
        imported = import_torch(Ranker().eval(), (torch.randn(4, 16),), fallback="eager")
        values = {imported.inputs[0]: torch.randn(4, 16), **imported.weights}
        print(json.dumps(check_graph(imported.optimized.main, values, {})))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report) == 3
    for out in report:
        assert out["rel_err"] < 1e-5, out


def test_a_size_from_a_dynamic_dim_is_refused() -> None:
    class Roll(torch.nn.Module):
        def forward(self, x):
            return torch.roll(x, shifts=x.shape[0], dims=1) + 1

    dyn = ({0: torch.export.Dim("batch", min=2, max=64)},)
    with pytest.raises(UnsupportedOps) as err:
        xg.compile(Roll(), (torch.randn(4, 16),), tune="predict", fallback="eager", dynamic_shapes=dyn)
    assert "aten.roll" in str(err.value) and "dynamic dim" in str(err.value)
    assert "it takes it takes" not in str(err.value)


def test_bad_fallback_value_and_unknown_operator() -> None:
    with pytest.raises(XGError, match="fallback must be 'error'"):
        xg.compile(Ranker().eval(), (torch.randn(4, 16),), fallback="python")
    with pytest.raises(ExecutionError, match="not on XG's list"):
        resolve("nosuchlib.op.default")


def test_a_result_of_another_integer_type_is_an_error_naming_the_operator() -> None:
    from xgbuild.compiler.ir.graph import Node, Op, attrs_of
    from xgbuild.compiler.importers.extern_args import dumps
    from xgbuild.runtime.extern import call
    node = Node(0, Op.EXTERN, (0,), "int32", (3,),
                attrs_of(call="aten.argsort.default", args=dumps([{"$t": 0}], {})))
    with pytest.raises(ExecutionError, match=r"aten.argsort.default.*returned int64\[3\].*compiled for int32\[3\]"):
        call(node, [torch.tensor([3.0, 1.0, 2.0])], torch.device("cpu"))


def test_a_multi_result_operator_runs_once_per_run() -> None:
    """topk's values and indices come from one call (a random operator's pieces must agree)."""
    from xgbuild.compiler.ir.graph import Node, Op, attrs_of
    from xgbuild.compiler.importers.extern_args import dumps
    from xgbuild.runtime.extern import call
    args = dumps([{"$t": 0}, 2], {})
    values = Node(1, Op.EXTERN, (0,), "float32", (2,), attrs_of(call="aten.topk.default", args=args, output=0))
    indices = Node(2, Op.EXTERN, (0,), "int64", (2,), attrs_of(call="aten.topk.default", args=args, output=1))
    x, memo = torch.tensor([0.5, 3.0, 2.0]), {}
    assert torch.equal(call(values, [x], torch.device("cpu"), memo), torch.tensor([3.0, 2.0]))
    assert torch.equal(call(indices, [x], torch.device("cpu"), memo), torch.tensor([1, 2]))
    assert len(memo[("aten.topk.default", args)]) == 1


def test_an_op_form_the_table_cannot_express_falls_back_too() -> None:
    class Pow(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).pow(1.7) + 1.0

    x = torch.rand(3, 5) + 0.1
    with pytest.raises(UnsupportedOps, match="aten.pow"):
        xg.compile(Pow(), (x,), kernels=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        engine = xg.compile(Pow(), (x,), kernels=False, fallback="eager")
    y = torch.rand(3, 5, generator=torch.Generator().manual_seed(2)) + 0.1
    assert rel(engine(y), Pow()(y.double())) < 1e-6
