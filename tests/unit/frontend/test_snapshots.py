"""Rendered diagnostics, compared byte for byte with `snapshots/*.stderr`.

Run `pytest tests/unit/frontend/test_snapshots.py --update-snapshots` to rewrite them after an
intended change, then review the diff.
"""

from pathlib import Path

import pytest

from xgbuild.compiler.frontend import check_source

SNAPSHOTS = sorted((Path(__file__).parent / "snapshots").glob("*.xg"))


@pytest.mark.parametrize("path", SNAPSHOTS, ids=[p.stem for p in SNAPSHOTS])
def test_rendered_output(path: Path, update_snapshots: bool) -> None:
    rendered = check_source(path.read_text(), path.name).render() + "\n"
    expected_file = path.with_suffix(".stderr")
    if update_snapshots or not expected_file.exists():
        expected_file.write_text(rendered)
    assert rendered == expected_file.read_text()
