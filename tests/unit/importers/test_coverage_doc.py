"""docs/importers.md lists every op the importers translate, generated from their tables and the
op registry: the test fails when a translation is added without renewing the document."""

from __future__ import annotations

from pathlib import Path

import pytest

from xgbuild.compiler.importers import coverage

DOC = Path(__file__).resolve().parents[3] / "docs" / "importers.md"


def test_document_lists_the_tables_as_they_are() -> None:
    text = DOC.read_text()
    assert coverage.render(text) == text, ("docs/importers.md is stale: run "
                                           "python -m xgbuild.compiler.importers.coverage --write docs/importers.md")


def test_every_translation_is_listed_once() -> None:
    md = coverage.markdown()
    for title, table in coverage._tables().items():
        for name in table:
            assert md.count(f"`{name}`") == 1, f"{title} op {name}"


def test_render_needs_the_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        coverage.render("# no markers here\n")
    assert coverage.main(["--bogus"]) == 2
