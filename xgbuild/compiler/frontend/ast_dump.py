"""The typed AST as indented text, for `xgc --emit=ast`.

A walk with its own stack: a tree as deep as the parser allows (2,500 levels) needs no Python
recursion to print.
"""

from __future__ import annotations

from . import ast as A

_HIDDEN = ("nid", "span", "op_span", "method_span", "name_span", "binding_span", "var_span", "range_span")


def dump(module: A.Module, types: dict | None = None) -> str:
    lines: list[str] = []
    stack: list[tuple[object, int, str]] = [(module, 0, "")]
    while stack:
        node, depth, label = stack.pop()
        if isinstance(node, list):
            stack.extend((item, depth, label) for item in reversed(node))
            continue
        if not isinstance(node, A.Node):
            continue
        pad = "  " * depth + (f"{label}: " if label else "")
        scalars = []
        children = []
        for name in node.__slots__:
            if name in _HIDDEN:
                continue
            value = getattr(node, name)
            if isinstance(value, (A.Node, list)):
                children.append((value, depth + 1, name))
            elif value is not None:
                scalars.append(f"{name}={value!r}")
        ty = types.get(node.nid) if types else None
        lines.append(pad + type(node).__name__ + (" " + " ".join(scalars) if scalars else "")
                     + (f" : {ty}" if ty is not None else ""))
        stack.extend(reversed(children))
    return "\n".join(lines) + "\n"
