"""The op coverage of both importers, as the tables say it: every ATen op and ONNX op type with a
translation, grouped by the translation that handles it, and the IR op (compiler/ops) that the
one-to-one names map to. docs/importers.md carries this text between its coverage markers;
`python -m xgbuild.compiler.importers.coverage --write docs/importers.md` renews it and a test
fails when it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

BEGIN, END = "<!-- coverage:begin (generated: python -m xgbuild.compiler.importers.coverage --write docs/importers.md) -->", \
    "<!-- coverage:end -->"


def _tables() -> dict[str, dict[str, Callable]]:
    from . import aten_ops, aten_shape_ops, onnx_ops, onnx_shape_ops  # noqa: F401 (they fill the tables)
    from .aten_table import TABLE as ATEN_TABLE
    from .onnx_table import TABLE as ONNX_TABLE
    return {"PyTorch (ATen)": dict(ATEN_TABLE), "ONNX": dict(ONNX_TABLE)}


def _summary(fn: Callable) -> str:
    doc = (fn.__doc__ or "").strip()
    if not doc:
        return ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.replace("|", "\\|")


def markdown() -> str:
    from ..ops import ATEN, ONNX
    one_to_one = {"PyTorch (ATen)": ATEN, "ONNX": ONNX}
    lines = [BEGIN, ""]
    for title, table in _tables().items():
        names = sorted(table)
        lines += [f"### {title}: {len(names)} ops", "",
                  "| ops | translation |", "| --- | --- |"]
        mapped = [n for n in names if n in one_to_one[title]]
        if mapped:
            cells = ", ".join(f"`{n}` ({one_to_one[title][n].name})" for n in mapped)
            lines.append(f"| {cells} | one IR op each (compiler/ops registry: its dtype and shape rule, CPU "
                         "semantics, Triton code, VJP) |")
        groups: dict[Callable, list[str]] = {}
        for n in names:
            if n not in one_to_one[title]:
                groups.setdefault(table[n], []).append(n)
        for fn, ops in sorted(groups.items(), key=lambda kv: kv[1][0]):
            where = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
            summary = _summary(fn)
            lines.append(f"| {', '.join(f'`{o}`' for o in ops)} | {summary + ' ' if summary else ''}(`{where}`) |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def render(doc: str) -> str:
    """`doc` with its coverage section replaced by the tables' current text."""
    if BEGIN not in doc or END not in doc:
        raise ValueError("the document has no coverage markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + markdown() + tail


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write":
        path = Path(argv[1])
        path.write_text(render(path.read_text()))
        return 0
    if not argv:
        print(markdown())
        return 0
    print("usage: python -m xgbuild.compiler.importers.coverage [--write docs/importers.md]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
