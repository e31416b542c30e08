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
        assert set(d) == {"code", "severity", "message", "file", "line", "col", "end_line", "end_col", "help", "notes"}
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
    assert proc.returncode == 2     # a usage error of the command line (issue 25)
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


# ------------------------------------------------------------------------------ issue 25: diagnostics that fit

def test_bad_target_option_is_a_usage_error_without_a_source_underline() -> None:
    proc = run("xgc", "examples/norms.xg", "--check", "--target", "H10O")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error[XG0013]: unknown target GPU `H10O`"), proc.stderr
    assert "-->" not in proc.stderr and "TARGET_GPU" not in proc.stderr and "^" not in proc.stderr
    assert "`--target`" in proc.stderr and "H100" in proc.stderr


def test_bad_target_in_the_source_still_underlines_it(tmp_path: Path) -> None:
    src = tmp_path / "t.xg"
    src.write_text("TARGET_GPU = H10O\ndef main() {\n    return 1\n}\n")
    proc = run("xgc", str(src), "--check")
    assert proc.returncode == 1 and "1 | TARGET_GPU = H10O" in proc.stderr, proc.stderr


def test_missing_close_paren_notes_the_open_paren(tmp_path: Path) -> None:
    src = tmp_path / "p.xg"
    src.write_text("extern Tensor[float32, N] X\ndef main() {\n    y = exp(X * 2.0\n    return y\n}\n")
    proc = run("xgc", str(src), "--check")
    assert proc.returncode == 1
    assert "= note: the `(` at line 3, column 12 is never closed: `y = exp(X * 2.0`" in proc.stderr, proc.stderr


def test_foreign_keyword_gets_did_you_mean(tmp_path: Path) -> None:
    src = tmp_path / "k.xg"
    src.write_text("extern Tensor[float32, N, M] X\ndef main() {\n"
                   "    return mean(X, axis=1), sum(X, dim=1, keepdims=true), max(X, dmi=0)\n}\n")
    helps = [d["help"] for d in json.loads(run("xgc", str(src), "--check", "--json").stdout)["diagnostics"]]
    assert helps[0].startswith("did you mean `dim`? accepted:"), helps
    assert helps[1].startswith("did you mean `keepdim`? accepted:"), helps
    assert helps[2].startswith("did you mean `dim`? accepted:"), helps


def test_json_diagnostics_carry_end_positions(tmp_path: Path) -> None:
    src = tmp_path / "bad.xg"
    src.write_text("def main() {\n    return 1 + 2.5 / 0.0\n}\n")
    diag = json.loads(run("xgc", str(src), "--check", "--json").stdout)["diagnostics"][0]
    assert (diag["line"], diag["col"], diag["end_line"], diag["end_col"]) == (2, 22, 2, 25)


def test_diagnostics_are_plain_in_a_pipe(tmp_path: Path) -> None:
    src = tmp_path / "bad.xg"
    src.write_text("def main() {\n    return 1 + 2.5 / 0.0\n}\n")
    assert "\x1b[" not in run("xgc", str(src), "--check").stderr


def test_diagnostics_are_coloured_on_a_terminal_unless_no_color(monkeypatch, capsys) -> None:
    import io

    from xgbuild.cli.common import write_diagnostics

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    text = "error[XG0300]: cannot prove the divisor `b` is nonzero\n --> f.xg:2:16\n  |\n2 |     a / b\n" \
           "  |         ^ this divisor may be zero"
    for var in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    write_diagnostics(text)
    coloured = tty.getvalue()
    assert "\x1b[1;31merror[XG0300]\x1b[0m" in coloured and "\x1b[1;31m^ this divisor" in coloured
    monkeypatch.setenv("NO_COLOR", "1")
    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    write_diagnostics(text)
    assert tty.getvalue() == text + "\n"
