"""The node values of one run: views computed in torch from the values they view (never copied
where torch can help it), every other node from a base function or set by a kernel.

The kernel executor (`gpu.py`) runs on these; the tuner binds kernels on meta tensors through
them at the tuning shape, so that build and run see the same layouts.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..compiler.codegen.schedule import VIEWS
from ..compiler.ir.graph import COLLECTIVE, Graph, Node, Op
from ..errors import ExecutionError
from .cpu import index_view

# A rank's collective: (node, its input's value, in place?) -> the result, or a callable that waits
# for it. In place: the input is a buffer nothing else reads, which the collective may overwrite.
Collective = Callable[..., "torch.Tensor | Callable[[], torch.Tensor]"]


class Values:
    """The node values of one run: views computed on demand from the values they view (never
    copied where torch can help it), every other node from `base` or set by a kernel.

    Collectives are views of their input within one process. With `collective` (one rank of an
    SPMD run) they are real: `start(n)` hands the input to it and keeps what comes back, a tensor
    or a callable that waits for the transfer, called when a consumer first reads the value."""

    def __init__(self, graph: Graph, base: Callable[[Node], torch.Tensor], meta: bool = False,
                 collective: Collective | None = None) -> None:
        self.graph, self.base, self.meta, self.collective = graph, base, meta, collective
        self.vals: dict[int, torch.Tensor] = {}
        self.pending: dict[int, Callable[[], torch.Tensor]] = {}

    def __call__(self, nid: int) -> torch.Tensor:
        if nid not in self.vals:
            n = self.graph.node(nid)
            if nid in self.pending:
                self.vals[nid] = self.pending.pop(nid)()
            elif n.op in COLLECTIVE and self.collective is not None:
                self.start(n)
                return self(nid)
            elif n.op in VIEWS:
                self.vals[nid] = view(n, [self(i) for i in n.inputs], self.meta)
            else:
                self.vals[nid] = self.base(n)
        return self.vals[nid]

    def start(self, n: Node) -> None:
        """Issue collective `n` on its input's value (computed by now)."""
        if n.id in self.vals or n.id in self.pending:
            return
        assert self.collective is not None
        out = self.collective(n, self(n.inputs[0]))
        if isinstance(out, torch.Tensor):
            self.vals[n.id] = out
        else:
            self.pending[n.id] = out

    def __setitem__(self, nid: int, value: torch.Tensor) -> None:
        self.vals[nid] = value


def view(n: Node, inputs: list[torch.Tensor], meta: bool = False) -> torch.Tensor:
    """A view node applied to its inputs' values (zero-copy where torch can; run-time indices read
    back to the host, or taken as 0 on `meta` tensors, where only layouts matter)."""
    x = inputs[0]
    if n.op is Op.RESHAPE:
        return x.reshape(tuple(n.shape))
    if n.op is Op.TRANSPOSE:
        return x.transpose(n.attr("dim0"), n.attr("dim1"))
    if n.op in COLLECTIVE:
        return x                        # one process holds every shard
    if n.op is Op.INDEX:
        return index_view(n, x, lambda k: 0 if meta else int(inputs[k].item()))
    raise ExecutionError(f"internal: `{n.op.value}` is not a view")
