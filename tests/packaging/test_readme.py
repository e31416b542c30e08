"""The README's commands run as written (issue 25, finding 3): its "Using it" block puts
`.venv/bin` on PATH once and then calls `xgc`, `xgrun` and `xgbuild` by name, as the seed's
examples do; tools/setup.sh ends by printing that same line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PATH_LINE = "source .venv/bin/activate"


def _block(heading: str) -> list[str]:
    section = README.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    body = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("  #", 1)[0].strip() for line in body.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_lists_the_setup_and_test_commands() -> None:
    assert _block("The two commands") == ["tools/run-examples", "tools/test"]
    assert "`tools/setup.sh`" in README


def test_using_it_puts_the_commands_on_path_once_then_calls_them_by_name() -> None:
    first, *rest = _block("Using it")
    assert first == PATH_LINE
    assert rest and all(line.split()[0] in {"xgc", "xgrun", "xgbuild"} for line in rest), rest
    assert ".venv/bin/xg" not in README


def test_setup_prints_the_readmes_path_line() -> None:
    assert PATH_LINE in (ROOT / "tools" / "setup.sh").read_text()


def test_the_readmes_check_commands_run_as_written() -> None:
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip(".venv is missing: tools/setup.sh makes it")
    first, *rest = _block("Using it")
    checks = [line for line in rest if line.endswith("--check") or line.endswith("--check --json")]
    assert len(checks) == 2, checks
    script = "set -e\n" + "\n".join([first, "command -v xgc xgrun xgbuild", *checks])
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = done.stdout.splitlines()[:3]
    assert all(Path(p).parent.resolve() == (ROOT / ".venv" / "bin").resolve() for p in found), found
    assert '"ok": true' in done.stdout
