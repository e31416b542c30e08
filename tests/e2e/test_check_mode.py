"""Check mode: a NaN/Inf in an output fails the run, naming the op that made it and its line.

Through the API (`ExecutionError`) and through `xgrun` (exit 1, one `error:` line). Values that
the program computes but discards (the other side of a `where`, the `a / b` of a guarded
`safe_div` with `b == 0`) must not trip it; `--no-check` / `check=False` turns it off.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, Rand, assert_clean_failure, cli, compile_text, src_text

import xg
from xgbuild.runtime.tensor_io import save_tensors

LOG = src_text("""
    extern Tensor[float32, N] X
    def main() {
        y = X * 2.0
        return log(y) + 1.0
    }
""")

SQRT = src_text("""
    extern Tensor[float32, N] X
    def root(Tensor[float32, N] x) -> Tensor[float32, N] {
        return sqrt(x - 1.0)
    }
    def main() {
        return root(X) * 3.0
    }
""")

DISCARDED = src_text("""
    extern Tensor[float32, N] X
    extern Tensor[float32] B
    def safe_div(float32 a, float32 b) -> Result[float32] {
        if b == 0 { return DivByZero }
        return Ok(a / b)
    }
    def main() {
        a = where(X > 0.0, sqrt(X), sqrt(0.0 - X))
        return a, safe_div(1.0, B).unwrap_or(0.0), safe_div(0.0, B)
    }
""")


def negative_somewhere(rand: Rand, n: int) -> torch.Tensor:
    x, _ = rand.tensor((n,))
    x = x.abs() + 0.5
    x[int(rand.gen.integers(0, n))] *= -1
    return x


# ------------------------------------------------------------------------------------ API

def test_nan_from_log_names_the_op_and_line(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, LOG)
    x = negative_somewhere(rand, rand.size(2, 10))
    with pytest.raises(xg.ExecutionError) as info:
        engine.run({"X": x})
    message = str(info.value)
    assert "NaN" in message and "`log`" in message and "line 4" in message, message


def test_nan_from_sqrt_in_a_function_names_the_function_line(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, SQRT)
    x = negative_somewhere(rand, rand.size(2, 10)) - 2.0
    with pytest.raises(xg.ExecutionError, match=r"`sqrt` \(node %\d+\) at line 3"):
        engine.run({"X": x})


def test_no_check_returns_the_nan(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, LOG)
    x = negative_somewhere(rand, 6)
    y = engine.run({"X": x}, check=False).value
    neg = (x < 0).numpy()
    assert np.isnan(y.numpy()[neg]).all() and np.isfinite(y.numpy()[~neg]).all()
    assert xg.run_engine(engine, external_values={"X": x}, check=False).metadata["check"] is False


def test_nan_in_an_input_is_reported_as_the_input(tmp_path) -> None:
    engine = compile_text(tmp_path, SQRT)
    with pytest.raises(xg.ExecutionError, match="the input `X`"):
        engine.run({"X": torch.tensor([2.0, math.nan])})


def test_discarded_branches_do_not_trip_the_check(rand: Rand, tmp_path) -> None:
    engine = compile_text(tmp_path, DISCARDED)
    x = negative_somewhere(rand, rand.size(2, 10))
    a, q, r = engine.run({"X": x, "B": torch.tensor(0.0)}, check=True).value
    assert np.allclose(a.numpy(), np.sqrt(np.abs(x.numpy())))
    assert q == 0.0 and r == xg.ResultValue(False, None, "DivByZero")


def test_safe_div_example_by_zero_passes_the_check(example_engines) -> None:
    # examples/safe_div.xg divides 1.0 by 0.0 inside a guarded safe_div.
    assert xg.run_engine(example_engines["safe_div"], check=True).value[1] == -1.0


def test_the_message_says_what_the_output_holds(tmp_path) -> None:
    """exp overflows to Inf and Inf - Inf is NaN: the output holds NaN, which is what the user sees."""
    engine = compile_text(tmp_path, src_text("""
        extern Tensor[float32, N] X
        def main() {
            e = exp(X)
            return e - e * 1.0
        }
    """))
    with pytest.raises(xg.ExecutionError) as info:
        engine.run({"X": torch.tensor([1.0, 100.0])})
    message = str(info.value)
    assert "`exp`" in message and "line 3" in message, message
    assert "an output holds NaN" in message, message


def test_a_constant_folded_nan_still_names_its_op(tmp_path) -> None:
    """`log` of a negative constant is folded at compile time; the report must still say `log`."""
    engine = compile_text(tmp_path, src_text("""
        extern Tensor[float32, N] X
        def main() {
            c = log(cast(-1, float32))
            return X + c
        }
    """))
    with pytest.raises(xg.ExecutionError) as info:
        engine.run({"X": torch.ones(3)})
    message = str(info.value)
    assert "line 3" in message and "`log`" in message, message


# ------------------------------------------------------------------------------------ xgrun

@pytest.fixture
def log_engine(tmp_path):
    path = tmp_path / "log.xge"
    compile_text(tmp_path, LOG, "log.xg").save(path)
    return path


def test_xgrun_check_failure_is_exit_1_naming_log(rand: Rand, tmp_path, log_engine) -> None:
    inputs = tmp_path / "in.npz"
    save_tensors(inputs, {"X": negative_somewhere(rand, 5)})
    res = cli("xgrun", log_engine, "--inputs", inputs)
    assert_clean_failure(res, "`log`", "line 4", "NaN")


def test_xgrun_no_check_succeeds(rand: Rand, tmp_path, log_engine) -> None:
    inputs = tmp_path / "in.npz"
    save_tensors(inputs, {"X": negative_somewhere(rand, 5)})
    res = cli("xgrun", log_engine, "--inputs", inputs, "--no-check")
    assert res.code == 0 and res.err == "", res.both
    assert "check off" in res.out


def test_xgrun_safe_div_by_zero_passes_the_check(tmp_path) -> None:
    path = tmp_path / "discarded.xge"
    compile_text(tmp_path, DISCARDED, "discarded.xg").save(path)
    inputs = tmp_path / "in.safetensors"
    save_tensors(inputs, {"X": torch.tensor([-4.0, 9.0]), "B": torch.tensor(0.0)})
    res = cli("xgrun", path, "--inputs", inputs, "--json")
    assert res.code == 0, res.both


def test_xgrun_runs_the_safe_div_example(example_files) -> None:
    assert cli("xgrun", example_files["safe_div"]).code == 0
    assert (EXAMPLES / "safe_div.xg").exists()
