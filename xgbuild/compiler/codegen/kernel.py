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
