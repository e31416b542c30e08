"""Diagnostics as data: each `cases/*.xg` file carries its expected diagnostics inline.

A line ending in `#~ ERROR XG0100` (or `WARNING`, `NOTE`) must get exactly that diagnostic, and
nothing may be reported that is not expected — so one mistake giving two errors fails too.
"""

import re
from pathlib import Path

import pytest

from xgbuild.compiler.frontend import check_file

CASES = sorted((Path(__file__).parent / "cases").glob("*.xg"))
_EXPECT = re.compile(r"#~\s*(ERROR|WARNING|NOTE)\s+(XG\d{4})")


def expected(path: Path) -> list[tuple[int, str, str]]:
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        for severity, code in _EXPECT.findall(line):
            out.append((lineno, severity.lower(), code))
    return sorted(out)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_file(path: Path) -> None:
    result = check_file(path)
    got = sorted((d.line, d.severity.value, d.code) for d in result.diagnostics)
    assert got == expected(path), "\n" + result.render()


def test_case_files_cover_every_rule_and_accept_something() -> None:
    names = {p.stem for p in CASES}
    for rule in ("rule1_dtypes", "rule2_casts", "rule3_division", "rule3_bounds", "rule4_main", "rule5_results"):
        assert rule in names
    assert check_file(Path(__file__).parent / "cases" / "accepted.xg").ok
