"""`xgc --check` and `xgbuild explain` as a user runs them: exit codes, JSON, stderr."""

import json
import subprocess
import sys
from pathlib import Path

from xgbuild.compiler.frontend.codes import CODES

REPO = Path(__file__).resolve().parents[3]


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"xgbuild.cli.{module}", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_check_clean_program_exits_0() -> None:
    proc = run("xgc", "examples/cluster_matmul.xg", "--check")
    assert proc.returncode == 0, proc.stderr


def test_check_warnings_only_exit_0() -> None:
    proc = run("xgc", "examples/contract.xg", "--check")
    assert proc.returncode == 0
    assert "warning[XG0700]" in proc.stderr


def test_check_errors_exit_1_with_rustc_layout(tmp_path: Path) -> None:
    src = tmp_path / "bad.xg"
    src.write_text("def main() {\n    return 1 + 2.5 / 0.0\n}\n")
    proc = run("xgc", str(src), "--check")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == "error[XG0300]: cannot prove the divisor `0.0` is nonzero"
    assert lines[1] == f" --> {src}:2:22"
    assert lines[3] == "2 |     return 1 + 2.5 / 0.0"
    assert lines[4].endswith("^^^ this divisor may be zero")


def test_json_is_one_object_on_stdout(tmp_path: Path) -> None:
    src = tmp_path / "bad.xg"
    src.write_text("def f(int64 a, float32 b) -> int64 {\n    return a + b\n}\ndef main() {\n    x = 1\n}\n")
    proc = run("xgc", str(src), "--check", "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert [(d["code"], d["severity"], d["line"], d["col"]) for d in report["diagnostics"]] == [
        ("XG0100", "error", 2, 14), ("XG0700", "warning", 5, 5)]
    for d in report["diagnostics"]:
        assert set(d) == {"code", "severity", "message", "file", "line", "col", "help"}
        assert d["file"] == str(src)


def test_json_ok_program() -> None:
    proc = run("xgc", "examples/norms.xg", "--check", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {"ok": True, "diagnostics": []}


def test_json_missing_file_exit_2(tmp_path: Path) -> None:
    proc = run("xgc", str(tmp_path / "gone.xg"), "--check", "--json")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["diagnostics"][0]["code"] == "XG0007"


def test_path_through_a_file_exit_2(tmp_path: Path) -> None:
    src = tmp_path / "plain.xg"
    src.write_text("def main() { return 1 }\n")
    proc = run("xgc", str(src / "child.xg"), "--check")
    assert proc.returncode == 2 and "XG0007" in proc.stderr and "Traceback" not in proc.stderr


def test_usage_errors_exit_2() -> None:
    assert run("xgc").returncode == 2
    assert run("xgc", "examples/norms.xg", "--num-gpu", "0", "--check").returncode == 2
    assert run("xgc", "examples/norms.xg", "--bogus").returncode == 2


def test_unknown_target_lists_known(tmp_path: Path) -> None:
    proc = run("xgc", "examples/norms.xg", "--check", "--target", "H900")
    assert proc.returncode == 1
    assert "unknown target GPU `H900`" in proc.stderr and "GB200" in proc.stderr and "RTX4090" in proc.stderr


def test_target_override_note() -> None:
    proc = run("xgc", "examples/safe_div.xg", "--check", "--target", "h100", "--num-gpu", "2")
    assert proc.returncode == 0
    assert "note[XG0702]" in proc.stderr and "--target=h100" in proc.stderr


def test_explain_every_code() -> None:
    for code in ("XG0100", "xg0300", "XG0401"):
        proc = run("xgbuild", "explain", code)
        assert proc.returncode == 0 and proc.stdout.startswith(code.upper() + ":")
    proc = run("xgbuild", "explain", "XG4242")
    assert proc.returncode == 2 and "unknown diagnostic code" in proc.stderr


def test_every_code_is_documented_and_formats() -> None:
    import string
    for code, entry in CODES.items():
        assert code.startswith("XG") and len(code) == 6
        assert entry.explanation and entry.title
        fields = [f for _, f, _, _ in string.Formatter().parse(entry.message) if f]
        text = entry.fmt(**{f: "x" for f in fields})
        assert text and not text.endswith(".") and text[0].islower() or text[0] in "`x"
