"""The typed AST as indented text, for `xgc --emit=ast`."""

from __future__ import annotations

from . import ast as A


def dump(module: A.Module, types: dict | None = None) -> str:
    lines: list[str] = []

    def visit(node, depth: int, label: str = "") -> None:
        pad = "  " * depth + (f"{label}: " if label else "")
        if isinstance(node, list):
            for item in node:
                visit(item, depth, label)
            return
        if not isinstance(node, A.Node):
            return
        scalars = []
        children = []
        for name in node.__slots__:
            if name in ("nid", "span", "op_span", "method_span", "name_span", "binding_span"):
                continue
            value = getattr(node, name)
            if isinstance(value, (A.Node, list)):
                children.append((name, value))
            elif value is not None:
                scalars.append(f"{name}={value!r}")
        ty = types.get(node.nid) if types else None
        lines.append(pad + type(node).__name__ + (" " + " ".join(scalars) if scalars else "")
                     + (f" : {ty}" if ty is not None else ""))
        for name, child in children:
            visit(child, depth + 1, name)

    visit(module, 0)
    return "\n".join(lines) + "\n"
