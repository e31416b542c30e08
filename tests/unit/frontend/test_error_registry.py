"""Every user-facing compile error goes through the code registry and the one renderer."""

from __future__ import annotations

import ast
from pathlib import Path

from xgbuild.compiler.frontend.codes import CODES, NOT_DIFFERENTIABLE, NO_TUNED_KERNEL
from xgbuild.compiler.frontend.diagnostics import error_at, plain_error
from xgbuild.compiler.frontend.source import SourceFile

ROOT = Path(__file__).resolve().parents[3] / "xgbuild"


def test_no_compile_error_is_written_by_hand() -> None:
    """`CompileError("error: ...")` bypasses the registry: build errors with `error_at`/`plain_error`."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CompileError"
                    and node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr))):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not found, found


def test_plain_error_renders_code_notes_and_help() -> None:
    err = plain_error(NO_TUNED_KERNEL, missing=1, total=2, jobs="j1", notes=("a note",), help="do this")
    assert str(err) == ("error[XG1002]: no tuned kernel for 1 of 2 jobs: j1\n"
                        "  = note: a note\n  = help: do this")
    assert [d.code for d in err.diagnostics] == ["XG1002"] and "XG1002" in CODES


def test_error_at_aligns_the_gutter_past_line_nine() -> None:
    source = SourceFile("p.xg", "\n" * 11 + "y = grad(x)\n")
    err = error_at(NOT_DIFFERENTIABLE, "not here", source, "p.xg", (12, 5), help="h")
    assert str(err) == ("error[XG0112]: not here\n  --> p.xg:12:5\n   |\n12 | y = grad(x)\n   |     ^\n"
                        "   |\n   = help: h")
    module = error_at(NOT_DIFFERENTIABLE, "there", source, "p.xg", (3, 1, "lib"))
    assert str(module) == ("error[XG0112]: there\n --> p.xg\n  = note: in the imported module `lib`, "
                           "line 3, column 1")
