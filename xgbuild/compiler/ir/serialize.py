"""IR as text (for `--emit=ir`), JSON (engines and tools) and Graphviz DOT.

JSON is canonical: the same graph gives the same bytes. `from_json` reads untrusted input (an
engine file) and raises `IRError` on anything malformed, never another exception. `bounded_json`
is how untrusted JSON is parsed here and in the packager: its nesting and item count are measured
without recursion and capped before `json.loads` builds anything (Python's parser recurses, and
a few megabytes of `[[],[],…]` become gigabytes of lists).
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

from .graph import Graph, Node, Op, Program, tree_ids
from .verify import MAX_NODES, IRError, shape_problem

FORMAT = 1


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _attr_text(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_attr_text(x) for x in v) + ")"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def to_text(graph: Graph, notes: dict[int, str] | None = None) -> str:
    """The graph as text; `notes` adds a word after a node's type (the sharding plan's layouts)."""
    lines = [f"graph {graph.name}(" + ", ".join(f"{name}: %{nid}" for name, nid in graph.inputs) + ") {"]
    for n in graph.nodes:
        args = ", ".join(f"%{i}" for i in n.inputs)
        attrs = " ".join(f"{k}={_attr_text(v)}" for k, v in n.attrs)
        loc = f"  # {where(n.src)}" if n.src else ""
        note = f" @{notes[n.id]}" if notes and n.id in notes else ""
        lines.append(f"  %{n.id} = {n.op.value}({args}){' ' + attrs if attrs else ''} : {n.dtype}{_dims(n.shape)}{note}{loc}")
    lines.append(f"  return {_tree_text(graph.output)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _tree_text(tree: dict) -> str:
    if "t" in tree:
        return f"%{tree['t']}"
    if "tuple" in tree:
        return "(" + ", ".join(_tree_text(t) for t in tree["tuple"]) + ")"
    return f"result(tag=%{tree['result']['tag']}, value={_tree_text(tree['result']['value'])})"


def program_text(program: Program) -> str:
    parts = [to_text(g) for _, g in sorted(program.functions.items())]
    return "\n".join(parts + [to_text(program.main)])


MAX_JSON_DEPTH = 64          # XG's own documents nest 8 deep at most (an output tree of tuples, more)
MAX_JSON_ITEMS = 1 << 22     # values and containers: about 150k IR nodes, a few hundred MB as Python objects
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_DEPTH_STEP = tuple(1 if c in b"[{" else -1 if c in b"]}" else 0 for c in range(256))


def bounded_json(blob: bytes, what: str, *, max_depth: int = MAX_JSON_DEPTH,
                 max_items: int = MAX_JSON_ITEMS) -> Any:
    """`json.loads(blob)`, refused with a `ValueError` naming `what` when `blob` nests deeper than
    `max_depth` or holds more than `max_items` values, both measured before parsing, in C loops."""
    bare = _JSON_STRING.sub(b"", bytes(blob))        # brackets inside strings are not structure
    brackets = _NOT_BRACKET.sub(b"", bare)
    items = bare.count(b",") + (len(brackets) + 1) // 2 + 1
    if items > max_items:
        raise ValueError(f"{what} holds about {items} JSON values, over the limit of {max_items}")
    depth = max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    if depth > max_depth:
        raise ValueError(f"{what} nests {depth} levels deep, over the limit of {max_depth}")
    try:
        return json.loads(blob)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{what} is not JSON ({exc})") from None


_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": "nan" if v != v else ("inf" if v > 0 else "-inf")}   # strict JSON has no NaN
    return v


def to_json(graph: Graph) -> dict:
    return {
        "format": FORMAT,
        "name": graph.name,
        "inputs": [[name, nid] for name, nid in graph.inputs],
        "params": list(graph.params),
        "output": graph.output,
        "nodes": [{"id": n.id, "op": n.op.value, "inputs": list(n.inputs), "dtype": n.dtype,
                   "shape": list(n.shape), "attrs": [[k, _jsonable(v)] for k, v in n.attrs],
                   "src": list(n.src) if n.src else None} for n in graph.nodes],
    }


def dumps(graph: Graph) -> bytes:
    return (json.dumps(to_json(graph), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict) and set(v) == {"float"} and v["float"] in _NON_FINITE:
        return _NON_FINITE[v["float"]]
    return v


def _check_tree(tree: Any) -> dict:
    if not isinstance(tree, dict) or len(tree) != 1:
        raise IRError("malformed output tree")
    if "t" in tree:
        if not isinstance(tree["t"], int):
            raise IRError("malformed output tree")
    elif "tuple" in tree:
        if not isinstance(tree["tuple"], list):
            raise IRError("malformed output tree")
        for t in tree["tuple"]:
            _check_tree(t)
    elif "result" in tree:
        r = tree["result"]
        if not isinstance(r, dict) or set(r) != {"tag", "value"} or not isinstance(r["tag"], int):
            raise IRError("malformed output tree")
        _check_tree(r["value"])
    else:
        raise IRError("malformed output tree")
    return tree


def from_json(data: Any) -> Graph:
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise IRError(f"program IR has format {data.get('format') if isinstance(data, dict) else '?'}, "
                          f"this XG reads format {FORMAT}")
        nodes = []
        if len(data["nodes"]) > MAX_NODES:
            raise IRError(f"program IR has {len(data['nodes'])} nodes, over the limit of {MAX_NODES}")
        for raw in data["nodes"]:
            shape = tuple(raw["shape"])
            problem = shape_problem(shape)
            if problem:
                raise IRError(f"node %{raw.get('id')}: malformed shape ({problem})")
            src = raw.get("src")
            nodes.append(Node(int(raw["id"]), Op(raw["op"]), tuple(int(i) for i in raw["inputs"]), str(raw["dtype"]),
                              shape, tuple((str(k), _freeze(v)) for k, v in raw["attrs"]),
                              _src(src)))
        graph = Graph(str(data["name"]), tuple(nodes), tuple((str(n), int(i)) for n, i in data["inputs"]),
                      _check_tree(data["output"]), tuple(int(p) for p in data.get("params", [])))
    except IRError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise IRError(f"malformed program IR: {type(exc).__name__}: {exc}") from None
    return graph


def _src(src) -> tuple | None:
    if not src:
        return None
    if len(src) == 3:
        return (int(src[0]), int(src[1]), str(src[2]))
    return (int(src[0]), int(src[1]))


def where(src: tuple | None) -> str:
    """`line 12`, or `line 23 of std.optim`: a node's source position for messages."""
    if not src:
        return ""
    return f"line {src[0]}" + (f" of {src[2]}" if len(src) > 2 else "")


def loads(blob: bytes) -> Graph:
    try:
        data = bounded_json(blob, "program IR")
    except ValueError as exc:
        raise IRError(str(exc)) from None
    return from_json(data)


def to_dot(graph: Graph) -> str:
    out = [f'digraph "{graph.name}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    outputs = set(tree_ids(graph.output))
    for n in graph.nodes:
        label = f"%{n.id} {n.op.value}\\n{n.dtype}{_dims(n.shape)}"
        if n.op is Op.INPUT:
            label = f"{n.attr('name')}\\n{n.dtype}{_dims(n.shape)}"
        style = ', style=filled, fillcolor="#dde8ff"' if n.op is Op.INPUT else \
            (', style=filled, fillcolor="#ffe7c2"' if n.id in outputs else "")
        out.append(f'  n{n.id} [label="{label}"{style}];')
        for i in n.inputs:
            out.append(f"  n{i} -> n{n.id};")
    out.append("}")
    return "\n".join(out) + "\n"
