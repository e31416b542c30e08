"""`--const NAME=VALUE` (frontend/constants.py): file constants overridden from `xgc`, `xgbuild jobs`,
`xg.compile_file(consts=...)` and Bazel's `consts`; the constants computed from them follow; an
override is noted, recorded in the engine, and a bad one is a clear error."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xg
from xgbuild.compiler.frontend import CheckOptions, check_source
from xgbuild.compiler.frontend.constants import OverrideError, normalize, parse_override

REPO = Path(__file__).resolve().parents[3]

SRC = """TARGET_GPU = H100
D = 8
F = 4 * D
SCALE = 0.5
extern Tensor[float32, 2, D] X
extern Tensor[float32, D, F] W
def main() {
    return (X @ W) * SCALE
}
"""


def xgc(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xgbuild.cli.xgc", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_an_override_replaces_the_value_and_what_follows_from_it() -> None:
    result = check_source(SRC, "p.xg", CheckOptions(consts=normalize({"D": 4, "SCALE": 2})))
    assert result.ok, result.render()
    assert result.program.externals["W"].shape == (4, 16)
    assert result.program.constants["SCALE"] == 2.0 and isinstance(result.program.constants["SCALE"], float)
    notes = [d.message for d in result.diagnostics]
    assert notes == ["`D = 8` is overridden by `--const D=4`", "`SCALE = 0.5` is overridden by `--const SCALE=2.0`"]


def test_the_same_value_is_no_note() -> None:
    result = check_source(SRC, "p.xg", CheckOptions(consts=normalize({"D": 8})))
    assert result.ok and not result.diagnostics


@pytest.mark.parametrize("consts,message", [
    ({"Q": 3}, "`--const Q=3` overrides no constant of p.xg"),
    ({"d": 3}, "did you mean `D`?"),
    ({"D": 2.5}, "`--const D=2.5` gives a float, but `D` is an integer constant"),
    ({"SCALE": True}, "gives a boolean, but `SCALE` is a float constant"),
])
def test_a_bad_override_is_one_error(consts: dict, message: str) -> None:
    result = check_source(SRC, "p.xg", CheckOptions(consts=normalize(consts)))
    assert [d.code for d in result.diagnostics if d.severity.value == "error"] == ["XG0019"], result.render()
    assert message in result.render()


def test_a_negative_size_is_one_error_however_many_types_use_it() -> None:
    """`--const D=-1`: D is a dim of two externals and of `F`'s, yet one error, and none after it."""
    result = check_source(SRC, "p.xg", CheckOptions(consts=normalize({"D": -1})))
    errors = [d for d in result.diagnostics if d.severity.value == "error"]
    assert [d.code for d in errors] == ["XG0111"] and "non-negative integer" in result.render(), result.render()


@pytest.mark.parametrize("text,value", [("L=2", 2), ("LR = 3e-4", 3e-4), ("ON=true", True), ("N=-1_000", -1000),
                                        ("X=.5", 0.5), ("X=1.", 1.0)])
def test_parse_override(text: str, value) -> None:
    name, got = parse_override(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["L", "=2", "L=", "L=abc", "L=1e999", "1L=2", "TARGET_GPU=B200", "NUM_GPU=2",
                                  "L=99999999999999999999"])
def test_parse_override_refuses(text: str) -> None:
    with pytest.raises(OverrideError):
        parse_override(text)


def test_xgc_notes_the_override_and_refuses_bad_ones_with_usage_or_program_errors(tmp_path: Path) -> None:
    src = tmp_path / "p.xg"
    src.write_text(SRC)
    ok = xgc(str(src), "--check", "--const", "D=4")
    assert ok.returncode == 0 and "note[XG0702]: `D = 8` is overridden by `--const D=4`" in ok.stderr
    unknown = xgc(str(src), "--check", "--const", "Q=4")
    assert unknown.returncode == 1 and "error[XG0019]" in unknown.stderr
    assert f" --> {src}\n" in unknown.stderr            # no source line: the mistake is on the command line
    for bad in (["--const", "D=x"], ["--const", "D=1", "--const", "D=2"], ["--const", "NUM_GPU=2"]):
        res = xgc(str(src), "--check", *bad)
        assert res.returncode == 2 and res.stderr.startswith("error: "), res.stderr


def test_compile_file_takes_consts_and_the_engine_records_them(tmp_path: Path) -> None:
    src = tmp_path / "p.xg"
    src.write_text(SRC)
    engine = xg.compile_file(src, consts={"D": 4, "SCALE": "2.0"}, kernels=False)
    assert engine.manifest["consts"] == {"D": 4, "SCALE": 2.0}
    x, w = torch.randn(2, 4), torch.randn(4, 16)
    torch.testing.assert_close(engine.run({"X": x, "W": w}).value, (x @ w) * 2)
    assert "consts" not in xg.compile_file(src, kernels=False).manifest
    with pytest.raises(xg.XGError, match="consts"):
        xg.compile_file(src, consts=[("D", 4)], kernels=False)
    with pytest.raises(xg.XGError, match="the value must be"):
        xg.compile_file(src, consts={"D": None}, kernels=False)
    with pytest.raises(xg.CompileError, match="XG0019"):
        xg.compile_file(src, consts={"Q": 1}, kernels=False)


def test_verify_rebuild_applies_the_recorded_overrides(tmp_path: Path) -> None:
    src = tmp_path / "p.xg"
    src.write_text(SRC)
    engine = tmp_path / "p.xge"
    built = xgc(str(src), "--const", "D=4", "--no-kernels", "--out", str(engine), "--quiet")
    assert built.returncode == 0, built.stderr
    res = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgbuild", "verify", "--rebuild", str(engine)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "the same bytes" in res.stdout


def test_bazel_passes_consts_to_every_action_that_compiles() -> None:
    actions = (REPO / "rules_xg" / "private" / "actions.bzl").read_text()
    common = actions[actions.index("def _common_flags"):actions.index("def jobs_action")]
    assert 'args.add("--const", "%s=%s" % (name, value))' in common
    assert "_common_flags(args, build)" in actions[actions.index("def jobs_action"):actions.index("def tune_action")]
    assert "_common_flags(args, build)" in actions[actions.index("def link_action"):]
