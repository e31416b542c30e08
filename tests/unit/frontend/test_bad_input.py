"""Bad input is a diagnostic and an exit code, never a traceback or a hang."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from xgbuild.compiler.frontend import check_file, check_source

XGC = [sys.executable, "-m", "xgbuild.cli.xgc"]
REPO = Path(__file__).resolve().parents[3]


def run_xgc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(XGC + list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO)


def assert_clean_failure(proc: subprocess.CompletedProcess, code: int) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert "internal" not in proc.stderr


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "random.xg"
    path.write_bytes(random.Random().randbytes(4096))
    proc = run_xgc(str(path), "--check")
    assert_clean_failure(proc, 1)
    assert "XG000" in proc.stderr


def test_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.xg"
    path.write_bytes("def main() { return 1 } # caf\xe9\n".encode("latin-1"))
    proc = run_xgc(str(path), "--check")
    assert_clean_failure(proc, 1)
    assert "XG0003" in proc.stderr and "not valid UTF-8" in proc.stderr


def test_truncated_file(tmp_path: Path) -> None:
    src = (REPO / "examples" / "contract.xg").read_text()
    for cut in (len(src) // 3, len(src) // 2, len(src) - 3):
        path = tmp_path / f"cut{cut}.xg"
        path.write_text(src[:cut])
        proc = run_xgc(str(path), "--check")
        assert_clean_failure(proc, 1)


def test_deep_nesting_parentheses(tmp_path: Path) -> None:
    path = tmp_path / "deep.xg"
    path.write_text("def main() {\n    return " + "(" * 10_000 + "1" + ")" * 10_000 + "\n}\n")
    proc = run_xgc(str(path), "--check")
    assert_clean_failure(proc, 1)
    assert "XG0004" in proc.stderr


def test_deep_nesting_blocks() -> None:
    result = check_source("def main() {\n" + "if true {\n" * 5000 + "}\n" * 5000 + "return 1\n}\n")
    assert not result.ok and any(d.code == "XG0004" for d in result.diagnostics)


def test_long_operator_chain_is_fine() -> None:
    result = check_source("def main() {\n    return " + " + ".join(["1"] * 1500) + "\n}\n")
    assert result.ok, result.render()[:2000]


def test_one_megabyte_line(tmp_path: Path) -> None:
    path = tmp_path / "long.xg"
    # Long operands keep it under the lexer's token cap (XG0008): the chain's depth is the error.
    path.write_text("def main() {\n    x = 1" + " + 1.000000001" * 80_000 + " $\n    return x\n}\n")
    assert path.stat().st_size > 1_000_000
    proc = run_xgc(str(path), "--check")
    assert_clean_failure(proc, 1)
    assert "XG0004" in proc.stderr
    longest = max(len(line) for line in proc.stderr.splitlines())
    assert longest < 400, "a 1 MB source line must be shown as a window, not whole"


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.xg"
    path.write_text("")
    proc = run_xgc(str(path), "--check")
    assert_clean_failure(proc, 1)
    assert "XG0010" in proc.stderr


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert_clean_failure(run_xgc(str(tmp_path / "nope.xg"), "--check"), 2)
    assert_clean_failure(run_xgc(str(tmp_path), "--check"), 2)


def test_unreadable_file(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = tmp_path / "secret.xg"
    path.write_text("def main() { return 1 }\n")
    path.chmod(0)
    assert_clean_failure(run_xgc(str(path), "--check"), 2)


def test_nul_and_control_characters() -> None:
    result = check_source("def main() {\n    return 1\x00 + \x07 2\n}\n")
    assert not result.ok
    assert {d.code for d in result.diagnostics} <= {"XG0001", "XG0002"}


def test_api_never_raises_on_bad_paths(tmp_path: Path) -> None:
    assert not check_file(tmp_path / "missing.xg").ok
    assert not check_file(tmp_path).ok


def test_too_many_errors_stops() -> None:
    src = "def main() {\n" + "    x = a $ b\n" * 1000 + "    return 1\n}\n"
    result = check_source(src)
    assert not result.ok
    assert len(result.diagnostics) <= 101
    assert result.diagnostics[-1].code == "XG0006"
