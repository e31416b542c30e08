"""`COMPUTE = bfloat16` (frontend/precision.py): the mixed-precision policy a file states, overridden
or stated by `--const COMPUTE=...`; a value that is not a floating dtype is an XG0021 error; an
engine built with the override records it, and verifies and rebuilds with it."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xg
from xgbuild.compiler.frontend import CheckOptions, check_source
from xgbuild.compiler.frontend.constants import OverrideError, normalize, parse_override

SRC = """COMPUTE = bfloat16
D = 8
extern Tensor[float32, 2, D] X
extern Tensor[float32, D, 4] W
def main() {
    return X @ W
}
"""


def check(consts: dict | None = None, src: str = SRC):
    return check_source(src, "p.xg", CheckOptions(consts=normalize(consts or {})))


def errors(result) -> list[str]:
    return [d.code for d in result.diagnostics if d.severity.value == "error"]


def test_the_declared_policy_and_its_override() -> None:
    assert check().program.compute == "bfloat16"
    assert check({"COMPUTE": "float16"}).program.compute == "float16"
    off = check({"COMPUTE": "float32"})
    assert off.ok and off.program.compute is None        # float32 is the dtype programs are written in
    assert [d.message for d in off.diagnostics] == ["`COMPUTE = bfloat16` is overridden by `--const COMPUTE=float32`"]
    assert not check({"COMPUTE": "bfloat16"}).diagnostics    # the same value: no note
    # A file that states no policy takes one from the command line: COMPUTE is the compiler's.
    bare = SRC.replace("COMPUTE = bfloat16\n", "")
    assert check(src=bare).program.compute is None
    assert check({"COMPUTE": "bfloat16"}, bare).program.compute == "bfloat16"


@pytest.mark.parametrize("value", ["int64", "bool", "H100", "bf16", "2", "1.5", "true", "D"])
def test_a_policy_that_is_not_a_floating_dtype_is_xg0021(value: str) -> None:
    result = check(src=SRC.replace("COMPUTE = bfloat16", f"COMPUTE = {value}"))
    assert errors(result) == ["XG0021"], result.render()
    assert "`COMPUTE` takes a floating dtype" in result.render()
    assert "one of `float16`, `bfloat16`, `float32`, `float64`" in result.render()


@pytest.mark.parametrize("value", ["int8", "bf16", "Float32"])
def test_an_override_that_is_not_a_floating_dtype_is_xg0021(value: str) -> None:
    result = check({"COMPUTE": value})
    assert errors(result) == ["XG0021"], result.render()
    assert f"`--const COMPUTE={value}`" in result.render()


def test_parse_override_reads_a_dtype_name_for_compute_only() -> None:
    assert parse_override("COMPUTE=float32") == ("COMPUTE", "float32")
    for bad in ("COMPUTE=1.5", "COMPUTE=", "COMPUTE=bfloat 16", "D=float32"):
        with pytest.raises(OverrideError):
            parse_override(bad)
    with pytest.raises(OverrideError, match="dtype name"):
        normalize({"COMPUTE": 16})


def test_a_module_states_no_policy(tmp_path: Path) -> None:
    (tmp_path / "lib.xg").write_text("COMPUTE = bfloat16\ndef twice(float32 x) -> float32 {\n    return x * 2.0\n}\n")
    (tmp_path / "p.xg").write_text("import lib\ndef main() {\n    return twice(1.0)\n}\n")
    with pytest.raises(xg.CompileError, match="XG0016"):
        xg.compile_file(tmp_path / "p.xg", kernels=False)


def test_an_engine_records_the_override_and_rebuilds_with_it(tmp_path: Path) -> None:
    src = tmp_path / "p.xg"
    src.write_text(SRC)
    x, w = torch.randn(2, 8), torch.randn(8, 4)
    mixed = xg.compile_file(src, kernels=False)
    torch.testing.assert_close(mixed.run({"X": x, "W": w}).value,
                               (x.bfloat16() @ w.bfloat16()).float())   # the product's roundings
    engine = tmp_path / "p.xge"
    built = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgc", str(src), "--const", "COMPUTE=float32",
                            "--no-kernels", "--out", str(engine), "--quiet"], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    loaded = xg.load_engine(engine)
    assert loaded.manifest["consts"] == {"COMPUTE": "float32"}
    torch.testing.assert_close(loaded.run({"X": x, "W": w}).value, x @ w)
    res = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgbuild", "verify", "--rebuild", str(engine)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0 and "the same bytes" in res.stdout, res.stdout + res.stderr
