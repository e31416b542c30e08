"""One tuning job's inputs and its reference outputs: seeded random operands at the job's tuning
shape (index-only values, gather indices and views drawn as the program would make them), and the
kernel's outputs computed op by op by the CPU reference executor in float64 (or the program's own
dtypes: what eager gives), against which the tuner's gate checks every candidate."""

from __future__ import annotations

import torch

from ..compiler.codegen.schedule import VIEWS
from ..compiler.ir.graph import Node, Op
from ..compiler.ops import BINARY, UNARY
from ..dtypes import FLOAT_DTYPES, TORCH_DTYPES
from ..runtime.cpu import CpuExecutor
from ..runtime.values import Values
from .jobs import Job


class JobData:
    """Seeded random inputs for one job (at its tuning shape) and the float64 reference outputs.
    `device`: where the inputs are drawn (the measuring GPU: drawing hundreds of MB on a CPU costs
    seconds of a cold build); same seed and device, same inputs."""

    def __init__(self, job: Job, seed: int = 0, device: str | torch.device = "cpu") -> None:
        self.job = job
        self.seed = seed
        self.device = torch.device(device)
        self._bases: dict[int, torch.Tensor] = {}
        self._placed: dict[tuple[int, str], torch.Tensor] = {}     # (node, device) -> base there, copied once
        self._index_nodes: set[int] | None = None          # `_index_only`'s nodes, found on first use

    def base(self, nid: int) -> torch.Tensor:
        if nid not in self._bases:
            n = self.job.graph.node(nid)
            g = torch.Generator(self.device).manual_seed(self.seed * 1_000_003 + nid)
            on = {"device": self.device}
            dt = TORCH_DTYPES[n.dtype]
            shape = tuple(n.shape)
            if self._index_only(nid):
                # Its own values: a kernel computes an arange along its last dim, and element-wise
                # ops of one (a padding's mask), from the index (`templates.local`'s `columnar`),
                # where another kernel reads them from memory; both must see the same.
                t = self._evaluated(nid).to(self.device)
            elif n.dtype in FLOAT_DTYPES:
                t = torch.randn(shape, generator=g, dtype=torch.float32, **on).to(dt)
            elif self._is_index(nid):
                t = torch.zeros(shape, dtype=dt, **on)      # a run-time index: 0 is in bounds of any dim
            elif (rows := self._gather_rows(nid)) is not None:
                t = torch.randint(0, max(rows, 1), shape, generator=g, **on).to(dt)    # rows of a table
            elif n.dtype == "bool":
                t = torch.randint(0, 2, shape, generator=g, **on).bool()
            elif n.dtype == "uint8":
                t = torch.randint(0, 16, shape, generator=g, **on).to(dt)
            else:
                t = torch.randint(-8, 8, shape, generator=g, **on).to(dt)
            self._bases[nid] = t
        return self._bases[nid]

    def _index_only(self, nid: int) -> bool:
        """An IOTA, or element-wise ops and reshapes of IOTAs and constants alone (found once for
        the whole graph, in program order: no recursion, no revisits of shared inputs)."""
        if self._index_nodes is None:
            graph, found = self.job.graph, set()
            for n in graph.nodes:
                if n.op is Op.IOTA or (n.inputs and (n.op is Op.RESHAPE or n.op in UNARY or n.op in BINARY)
                                       and all(i in found or graph.node(i).op is Op.CONST for i in n.inputs)):
                    found.add(n.id)
            self._index_nodes = found
        return nid in self._index_nodes

    def _evaluated(self, nid: int) -> torch.Tensor:
        """An index-only value computed on the CPU: the nodes it needs, in program order, once each."""
        graph = self.job.graph
        needed, stack = set(), [nid]
        while stack:
            i = stack.pop()
            if i not in needed:
                needed.add(i)
                stack.extend(graph.node(i).inputs)
        ex, vals = CpuExecutor(check=False, timings=False), {}
        for n in graph.nodes:
            if n.id not in needed:
                continue
            if n.op is Op.CONST:
                vals[n.id] = torch.tensor(n.attr("value"), dtype=TORCH_DTYPES[n.dtype])
            else:
                vals[n.id] = ex.eval(n, [vals[i] for i in n.inputs], {})
            if n.id == nid:
                return vals[nid]
        raise KeyError(nid)

    def _is_index(self, nid: int) -> bool:
        return any(n.op in (Op.INDEX, Op.UNINDEX) and nid in n.inputs[1:] for n in self.job.graph.nodes)

    def _gather_rows(self, nid: int) -> int | None:
        """The fewest rows among the tables that `nid`, or a view of it, indexes in a `gather` or a
        `scatter_add` (its indices spread evenly over the rows, as a vocabulary's tokens are)."""
        graph = self.job.graph
        viewed, rows = {nid}, None
        for n in graph.nodes:                 # topological: a view comes after what it views
            if n.op in VIEWS and n.inputs[0] in viewed:
                viewed.add(n.id)
            elif n.op is Op.GATHER and n.inputs[1] in viewed:
                r = int(graph.node(n.inputs[0]).shape[0])
                rows = r if rows is None else min(rows, r)
            elif n.op is Op.SCATTER_ADD and n.inputs[0] in viewed:
                r = int(n.attr("rows"))
                rows = r if rows is None else min(rows, r)
        return rows

    def value_fn(self, device: str | torch.device) -> Values:
        """The job's operand values on `device` (run-time indices of views taken as 0)."""
        def base(n: Node) -> torch.Tensor:
            if n.op is Op.CONST:
                return torch.tensor(n.attr("value"), dtype=TORCH_DTYPES[n.dtype], device=device)
            key = (n.id, str(device))
            if key not in self._placed:
                self._placed[key] = self.base(n.id).to(device)
            return self._placed[key]
        return Values(self.job.graph, base, meta=True)

    def reference(self, device: str | torch.device = "cpu", float64: bool = True) -> list[torch.Tensor]:
        """The kernel's outputs computed op by op by the reference executor in float64 (its torch
        ops on `device`: the GPU when measuring, where large references would take minutes on a CPU).
        With `float64=False`, in the program's own dtypes: what PyTorch eager gives (no TF32)."""
        try:
            return self._reference(device, float64)
        except RuntimeError:
            if str(device) == "cpu":
                raise
            return self._reference("cpu", float64)

    def _reference(self, device, float64: bool) -> list[torch.Tensor]:
        binding, nodes = self.job.sites[0]
        graph = self.job.graph
        ex = CpuExecutor(float64=float64, check=False, timings=False)
        inputs = self.value_fn(device)
        vals: dict[int, torch.Tensor] = {}

        def get(nid: int) -> torch.Tensor:
            if nid in vals:
                return vals[nid]
            if _view_of(nid):
                # A row value the kernel computes, read in its other row form (a reshape the
                # kernel reads in place, `codegen.kernel.row_value_through_view`): not an input.
                n = graph.node(nid)
                vals[nid] = ex.eval(n, [get(n.inputs[0])], {})
                return vals[nid]
            t = inputs(nid)
            return t.double() if t.dtype.is_floating_point and float64 else t

        inside = set(nodes)

        def _view_of(nid: int) -> bool:
            n = graph.node(nid)
            while n.op is Op.RESHAPE and n.inputs:
                if n.inputs[0] in inside:
                    return True
                n = graph.node(n.inputs[0])
            return False

        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False       # float32 means float32 products here
        try:
            # The reference ops make constants (iota, full) with torch's factories: on `device` too,
            # or a GPU reference of a masked kernel would fall back to the CPU (seconds of float64).
            with torch.device(device):
                for nid in nodes:
                    n = graph.node(nid)
                    vals[nid] = ex.eval(n, [get(i) for i in n.inputs], {})
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return [vals[nid] for nid in binding.outputs]     # on `device`: candidates are checked there
