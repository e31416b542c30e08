"""In-place ATen ops (`aten.add_`, `aten.masked_fill_`, `aten.copy_` ...) in a captured graph.

The graph torch.export gives (before `run_decompositions()`) keeps a model's in-place ops. XG's IR
has values, not buffers, so `x.add_(y)` is translated as `aten.add(x, y)` and every later use of
`x` (and of the nodes that are `x` itself: the in-place op's result, a chain of in-place ops)
reads the new value. That is exact only while nothing else sees the written storage: a view of
`x` read after the write, the tensor `x` is a view of, a model input or a weight. Those cases are
refused (`written` raises TranslationError naming why), never translated into a wrong answer.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .builder import TranslationError


def is_inplace(target: object) -> bool:
    """An ATen op that writes into its first argument and returns it (`add_`, `__iand__`, `copy_`)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    first = schema.arguments[0].alias_info if schema.arguments else None
    return first is not None and first.is_write


def functional(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional form of an in-place op, same overload (aten.add_.Tensor -> aten.add.Tensor),
    or None where PyTorch has none."""
    namespace, name = target._schema.name.split("::")
    if name.startswith("__i") and name.endswith("__"):
        name = "__" + name[3:]                          # __iand__ -> __and__
    elif name.endswith("_") and not name.endswith("__"):
        name = name[:-1]                                # add_ -> add
    else:
        return None
    packet = getattr(getattr(torch.ops, namespace), name, None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def _alias_sources(node: torch.fx.Node) -> tuple[list[torch.fx.Node], bool]:
    """The arguments `node`'s result shares storage with, and whether it is the same tensor as
    them (an in-place op's result) rather than a view."""
    import operator
    if node.op != "call_function":
        return [], False
    if node.target is operator.getitem:                 # an item of a view op's results (split, unbind)
        src = node.args[0]
        return ([src], False) if isinstance(src, torch.fx.Node) and _alias_sources(src)[0] else ([], False)
    if not isinstance(node.target, torch._ops.OpOverload):
        return [], False
    schema = node.target._schema
    returned = set()
    for r in schema.returns:
        if r.alias_info is not None:
            returned |= set(r.alias_info.before_set)
    if not returned:
        return [], False
    out, same = [], False
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not (set(a.alias_info.before_set) & returned):
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        out += [v for v in values if isinstance(v, torch.fx.Node)]
        same = same or a.alias_info.is_write
    return out, same


class Aliases:
    """Which nodes of one fx graph share storage, from the ops' schemas."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.order = {n: i for i, n in enumerate(graph.nodes)}
        self.shares: dict[torch.fx.Node, set[torch.fx.Node]] = defaultdict(set)
        self.same: dict[torch.fx.Node, set[torch.fx.Node]] = defaultdict(set)
        for n in graph.nodes:
            sources, same = _alias_sources(n)
            for src in sources:
                self.shares[n].add(src)
                self.shares[src].add(n)
                if same:
                    self.same[n].add(src)
                    self.same[src].add(n)

    @staticmethod
    def _closure(start: torch.fx.Node, edges: dict) -> set[torch.fx.Node]:
        seen, todo = {start}, [start]
        while todo:
            for m in edges.get(todo.pop(), ()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    def written(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        """The nodes that are the tensor the in-place op `node` writes (its first argument, the
        op itself, other in-place ops on it), all of which then read the new value. Raises
        TranslationError where another alias could see the write."""
        target = node.args[0] if node.args else None
        if not isinstance(target, torch.fx.Node):
            raise TranslationError("it writes into a value that is not a tensor of the graph")
        same = self._closure(target, self.same) | {node}
        family = self._closure(target, self.shares)
        at = self.order[node]
        for n in family:
            if n.op == "placeholder":
                raise TranslationError(f"it writes in place into `{n.name}`, an input of the graph (a model input "
                                       "or weight); clone it first: an engine never modifies its inputs or weights")
        for n in family - same:
            if self.order[n] < at and any(self.order.get(u, at + 1) > at for u in n.users):
                raise TranslationError(f"it writes in place into storage that `{n.name}` shares and is read "
                                       "after the write; XG translates in-place ops only where no other view "
                                       "sees the write")
        return same


__all__ = ["Aliases", "functional", "is_inplace"]
