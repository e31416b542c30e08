"""The CPU reference executor: runs any specialised Graph IR with torch on the CPU.

In `float64` mode every floating-point value is computed in float64: the reference that tests
compare engines against. Collective ops run as identity (one process holds every shard).
Check mode keeps intermediate values so that a NaN/Inf in an output can be traced to the first
op that produced it and its source line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..compiler.ir.graph import Graph, Node, Op, tree_ids
from ..compiler.ops import op_def
from ..compiler.ir.serialize import where as src_text
from ..errors import ExecutionError
from ..dtypes import FLOAT_DTYPES, TORCH_DTYPES  # noqa: F401 (TORCH_DTYPES re-exported for tests)


# The ops whose semantics need this executor's own state (engine inputs, seeded counters, run-time
# indices, PyTorch operators); every other op runs its registry definition (`OpDef.cpu`).
EXECUTOR_OPS = frozenset({Op.INPUT, Op.RANDN, Op.RAND, Op.EXTERN, Op.INDEX, Op.UNINDEX, Op.GATHER})

_M32 = 0xFFFFFFFF


def _pcg(x: torch.Tensor) -> torch.Tensor:
    """PCG's 32-bit output hash on int64 tensors holding uint32 values (portable to GPU kernels)."""
    state = (x * 747796405 + 2891336453) & _M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _M32
    return (word >> 22) ^ word


def _uniform(seed: int, n: int, lane: int) -> torch.Tensor:
    """24-bit uniforms in (0, 1) from (seed, element index, lane) alone."""
    key = _pcg(torch.tensor([seed & _M32], dtype=torch.int64) ^ _pcg(torch.tensor([(seed >> 32) & _M32])))
    idx = torch.arange(n, dtype=torch.int64)
    return (_pcg((key + 2 * idx + lane) & _M32) >> 8).to(torch.float64).add_(0.5).div_(1 << 24)


def counter_randn(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Normal samples from (seed, element index) alone: the same bits whatever computes them."""
    n = math.prod(shape)
    u1, u2 = _uniform(seed, n, 0), _uniform(seed, n, 1)
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.reshape(shape).to(dtype)


def counter_rand(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Uniform samples in (0, 1) from (seed, element index) alone."""
    return _uniform(seed, math.prod(shape), 0).reshape(shape).to(dtype)


def index_view(n: Node, x: torch.Tensor, index: Callable[[int], int]) -> torch.Tensor:
    """An INDEX node's items applied to `x`, one axis at a time: a view, except for negative steps
    (torch has no negative strides). `index(k)` reads the run-time index that is the node's k-th input."""
    axis = 0
    for pos, item in enumerate(n.attr("items")):
        size = x.shape[axis]
        if item[0] == "s":
            picks = range(size)[slice(item[1], item[2], item[3])]
            if picks.step > 0:
                x = x[(slice(None),) * axis + (slice(picks.start, picks.stop, picks.step),)]
            else:
                x = x.index_select(axis, torch.tensor(list(picks), dtype=torch.int64, device=x.device))
            axis += 1
            continue
        i = item[1] if item[0] == "i" else index(item[1])
        if not -size <= i < size:
            line = f" at {src_text(n.src)}" if n.src else ""
            raise ExecutionError(f"index {i} is out of bounds for dimension {pos} of size {size}{line}")
        x = x.select(axis, i)
    return x


def take_rows(n: Node, table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """A GATHER node: `table[idx]`, rows picked along dim 0. An index outside [0, rows) is an error
    here; GPU kernels read zeros for it instead (engines check index inputs before a run)."""
    rows = table.shape[0]
    flat = idx.reshape(-1).to(torch.int64)
    if flat.numel():
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= rows:
            line = f" at {src_text(n.src)}" if n.src else ""
            raise ExecutionError(f"index {lo if lo < 0 else hi} is out of bounds for a table of {rows} rows{line}")
    return table.index_select(0, flat).reshape(tuple(idx.shape) + tuple(table.shape[1:]))


@dataclass
class RunOutput:
    values: dict[int, torch.Tensor]     # output node id -> value
    timings: list[dict]                 # per node: id, op, line, ms, start_ms (from the run's start)
    pending: Any = None                 # a GPU run's check on its way to the host (verdicts.Pending)


class CpuExecutor:
    name = "cpu"

    def __init__(self, *, float64: bool = False, check: bool = True, timings: bool = True) -> None:
        self.float64 = float64
        self.check = check
        self.timings = timings
        self.memo: dict = {}            # one run's calls of multi-result PyTorch operators (EXTERN)

    def dtype(self, name: str) -> torch.dtype:
        if self.float64 and name in FLOAT_DTYPES:
            return torch.float64
        return TORCH_DTYPES[name]

    def run(self, graph: Graph, inputs: dict[str, torch.Tensor]) -> RunOutput:
        self.memo = {}
        outputs = set(tree_ids(graph.output))
        last_use: dict[int, int] = {}
        for n in graph.nodes:
            for i in n.inputs:
                last_use[i] = n.id
        vals: dict[int, torch.Tensor] = {}
        timings: list[dict] = []
        t_run = time.perf_counter()
        with torch.no_grad():
            for n in graph.nodes:
                t0 = time.perf_counter()
                try:
                    value = self.eval(n, [vals[i] for i in n.inputs], inputs)
                except ExecutionError:
                    raise
                except (RuntimeError, IndexError, ValueError, OverflowError) as exc:
                    where = f" at {src_text(n.src)}" if n.src else ""
                    raise ExecutionError(f"`{n.op.value}` (node %{n.id}){where} failed: {exc}") from None
                want = self.dtype(n.dtype)
                # torch widens some results (an int8 sum is int64); the IR's dtype is the contract.
                vals[n.id] = value if value.dtype == want else value.to(want)
                if self.timings:
                    timings.append({"id": n.id, "op": n.op.value, "line": n.src[0] if n.src else None,
                                    "ms": (time.perf_counter() - t0) * 1e3, "start_ms": (t0 - t_run) * 1e3})
                if not self.check:    # free what no later node reads (check mode keeps all, to trace NaNs)
                    for i in n.inputs:
                        if last_use.get(i) == n.id and i not in outputs:
                            vals.pop(i, None)
        if self.check:
            self.guard(graph, vals)
        return RunOutput({i: vals[i] for i in outputs}, timings)

    # --- ops ------------------------------------------------------------------------------------
    def eval(self, n: Node, args: list[torch.Tensor], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        op = n.op
        dt = self.dtype(n.dtype)
        if op is Op.INPUT:
            return inputs[n.attr("name")].to(dt)
        if op is Op.RANDN:
            # Samples are made in the declared dtype, then widened: float64 mode sees the same values.
            return counter_randn(int(args[0]), tuple(n.shape), TORCH_DTYPES[n.dtype]).to(dt)
        if op is Op.RAND:
            return counter_rand(int(args[0]), tuple(n.shape), TORCH_DTYPES[n.dtype]).to(dt)
        if op is Op.EXTERN:
            from .extern import call
            return call(n, args, args[0].device if args else torch.device("cpu"), self.memo, dt)
        if op is Op.INDEX:
            return self.gather(n, args[0], args)
        if op is Op.UNINDEX:
            # Where INDEX would read each element, put the incoming values: index a tensor of
            # flat positions the same way, then scatter.
            positions = self.gather(n, torch.arange(math.prod(n.shape)).reshape(n.shape), args)
            out = torch.zeros(math.prod(n.shape), dtype=args[0].dtype)
            out[positions.reshape(-1)] = args[0].reshape(-1)
            return out.reshape(n.shape)
        if op is Op.GATHER:
            return take_rows(n, args[0], args[1])
        semantics = op_def(op).cpu
        if semantics is None:
            raise ExecutionError(f"the CPU executor has no implementation of `{op.value}`")
        return semantics(n, args, dt)

    def gather(self, n: Node, x: torch.Tensor, args: list[torch.Tensor]) -> torch.Tensor:
        return index_view(n, x, lambda k: int(args[k]))

    # --- check mode -----------------------------------------------------------------------------
    def guard(self, graph: Graph, vals: dict[int, torch.Tensor]) -> None:
        for nid in tree_ids(graph.output):
            v = vals[nid]
            if v.dtype.is_floating_point and not bool(torch.isfinite(v).all()):
                origin = self.origin(graph, vals, nid, torch.ones_like(v, dtype=torch.bool))
                node = graph.node(origin)
                kind = "NaN" if bool(torch.isnan(v).any()) else "Inf"
                if node.op is Op.INPUT:
                    where = f"the input `{node.attr('name')}`"
                else:
                    where = f"`{node.op.value}` (node %{node.id})" + (f" at {src_text(node.src)}" if node.src else "")
                raise ExecutionError(f"check failed: an output holds {kind}; it first appears in {where}")

    def origin(self, graph: Graph, vals: dict[int, torch.Tensor], nid: int, mask: torch.Tensor) -> int:
        """The earliest node whose non-finite values flow (through `mask`ed positions) into `nid`.
        A loop, not recursion: the trace is as long as the chain of ops, which a program of
        thousands of statements makes thousands deep."""
        while True:
            node = graph.node(nid)
            bad = ~torch.isfinite(vals[nid]) & mask if vals[nid].dtype.is_floating_point else None
            if bad is None or not bool(bad.any()):
                return nid
            for pos, i in enumerate(node.inputs):
                v = vals[i]
                if not v.dtype.is_floating_point:
                    continue
                if node.op is Op.WHERE:
                    if pos == 0:
                        continue
                    cond = vals[node.inputs[0]]
                    chosen = cond if pos == 1 else ~cond
                    sub = torch.broadcast_to(chosen & bad, torch.broadcast_shapes(bad.shape, chosen.shape))
                elif node.op in (Op.INPUT, Op.CONST) or v.shape != bad.shape:
                    sub = torch.ones_like(v, dtype=torch.bool)
                else:
                    sub = bad
                if bool((~torch.isfinite(v) & sub).any()):
                    nid, mask = i, sub
                    break
            else:
                return nid
