"""What the scheduler produces and kernel templates read: a scheduled `Kernel` (its kind, nodes
and iteration domain), the `Schedule` of a graph, and `ScheduleError`.

Kept apart from the scheduling algorithm (`schedule.py`), which asks the kernel templates which
nodes may join a kernel of each kind, while the templates build specs from these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, Op, tree_ids


class ScheduleError(ValueError):
    """An op that has no GPU kernel path (yet): the build stops and says which, and where."""


@dataclass
class Kernel:
    kind: str                          # a kernel kind (templates.KINDS), or "extern" (no kernel: torch)
    anchor: int | None                 # the MATMUL or reduction node
    nodes: list[int] = field(default_factory=list)      # computed in the kernel, topological
    shape: tuple = ()                  # the iteration domain: output shape (rowwise: the anchor's input)
    reduce_dims: tuple[int, ...] = ()  # rowwise: the dims of `shape` reduced (the last one when fused)
    # attention: nodes computed from row/column indices alone (a causal mask from IOTAs), and the
    # views between them, evaluated inside the kernel instead of read from memory; topological.
    inlined: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.nodes[0]}"

    @property
    def extern(self) -> bool:
        """A PyTorch operator the engine calls eagerly ("extern"): the one kind with no kernel,
        so no spec and no template."""
        return self.kind == "extern"


@dataclass
class Schedule:
    graph: Graph
    kernels: list[Kernel]
    owner: dict[int, int]              # node id -> index of the kernel that computes it
    views: set[int]                    # nodes that are views of another node's memory
    inlined: set[int] = field(default_factory=set)   # computed inside the attention kernels that read them

    def inputs(self, k: Kernel) -> list[int]:
        """Nodes a kernel reads from memory (INPUTs, other kernels' outputs, views of them)."""
        inside = set(k.nodes)
        seen: list[int] = []
        for nid in k.nodes:
            for i in self.graph.node(nid).inputs:
                if i not in inside and i not in seen and i not in k.inlined and \
                        self.graph.node(i).op is not Op.CONST:
                    seen.append(i)
        return seen

    def outputs(self, k: Kernel) -> list[int]:
        """Nodes a kernel writes: those read outside it, or graph outputs."""
        inside = set(k.nodes)
        users = self.graph.users()
        graph_out = set(tree_ids(self.graph.output))
        out = []
        for nid in k.nodes:
            if nid in graph_out or any(u not in inside for u in users[nid]):
                out.append(nid)
        return out


def row_forms(k: Kernel) -> tuple[tuple, tuple] | None:
    """A last-dim row kernel's row-value shapes: kept ([T, 1]) and row ([T]); None for others."""
    if k.kind != "rowwise" or not k.shape or tuple(k.reduce_dims) != (len(k.shape) - 1,):
        return None
    return tuple(k.shape[:-1]) + (1,), tuple(k.shape[:-1])


def row_value_through_view(graph: Graph, k: Kernel, i: int, inside: set[int]) -> int | None:
    """The node of row kernel `k` that `i`, a chain of reshapes between the row forms, reads."""
    forms = row_forms(k)
    if forms is None:
        return None
    j = i
    while j not in inside and graph.node(j).op is Op.RESHAPE and tuple(graph.node(j).shape) in forms:
        j = graph.node(j).inputs[0]
    return j if j in inside and j != i and tuple(graph.node(j).shape) in forms else None


def column_iota(graph: Graph, k: Kernel, i: int) -> bool:
    """Whether `i`, read by a last-dim row kernel or an element-wise kernel `k` of rank >= 2, is a
    1-D IOTA as long as k's last dim (or a reshape of one to [1, .., 1, C]): the kernel computes
    it from each element's last index (cross-entropy's one-hot `target == arange(V)` and its
    gradient's: 8 bytes of int64 per logit read, where the logit is 2)."""
    if not (row_forms(k) is not None or (k.kind == "elementwise" and len(k.shape) >= 2)):
        return False
    n = graph.node(i)
    while n.op is Op.RESHAPE:
        shape = tuple(n.shape)
        if len(shape) > len(k.shape) or any(d != 1 for d in shape[:-1]) or not shape or shape[-1] != k.shape[-1]:
            return False
        n = graph.node(n.inputs[0])
    return n.op is Op.IOTA and tuple(n.shape) == (k.shape[-1],)
