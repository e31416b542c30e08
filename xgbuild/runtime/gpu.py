"""Runs an engine's kernels: views in torch (no copies), every computed value by a compiled kernel.

The executor serves two launchers: the CUDA driver (`KernelLauncher`, the deploy path) and
Triton's interpreter on CPU tensors (tests on hosts without a GPU). For each kernel it binds the
run's tensors, picks a compiled variant and its grid through the launch ABI
(`compiler/codegen/launch.py`, which the tuner uses too), and launches it with the sizes of this
run; it also records launches for replay, captures CUDA graphs and, on one rank of an SPMD run,
interleaves a matmul's row blocks with their collectives.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..compiler.codegen.launch import bind, block_rows, choose, grid_for, rows_of
from ..compiler.codegen.launch_abi import Compiled, ExternStep, KernelPlan, Launch, arguments
from ..compiler.codegen.schedule import VIEWS
from ..compiler.ir.graph import COLLECTIVE, Graph, Node, Op, tree_ids
from ..dtypes import TORCH_DTYPES
from ..errors import ExecutionError, XGError
from .cuda import CudaRuntimeError
from .cpu import CpuExecutor, RunOutput
from .lifetimes import computed_gathers, frees, release, shape_only_gathers
from .native import check_bits, guarded_outputs, made_by, where_of as _where
from .replay import Replay, record, remember, replay_args
from .rebind import Binder, TorchTouches, plan_buffers
from .values import Collective, Values
from .verdicts import Evidence, Mailbox, Pending, Verdicts, index_in_bounds

MAX_GRAPHS = 4           # captured CUDA graphs kept per executor (each holds its intermediates)


def _outputs(graph: Graph, value: Values, shared: dict) -> dict[int, torch.Tensor]:
    """The graph's outputs; one that is (a view of) a tensor every run shares, a constant's, is
    cloned, so that the caller can write to it."""
    held = {t.untyped_storage().data_ptr() for t in shared.values()}
    out = {}
    for nid in tree_ids(graph.output):
        t = value(nid)
        out[nid] = t.clone() if t.untyped_storage().data_ptr() in held else t
    return out


def gather_index_bounds(graph: Graph, value: Values, verified: frozenset[int] = frozenset()
                        ) -> tuple[list[tuple[Node, int]], torch.Tensor | None]:
    """The GATHERs whose indices the program computes (an engine input was checked before the run;
    `verified`: shape-only ones a run of this graph found in range), each with its table's rows,
    and one device tensor of their indices' [min, max]: queued, never synchronised, so a run
    captured as a CUDA graph computes them on every replay."""
    checks, bounds = [], []
    for n in computed_gathers(graph, verified):
        idx = value(n.inputs[1])
        if idx.numel():
            checks.append((n, graph.node(n.inputs[0]).shape[0]))
            bounds.append(torch.stack(torch.aminmax(idx)))
    return checks, (torch.stack(bounds) if bounds else None)


def raise_out_of_bounds(checks: list[tuple[Node, int]], bounds: torch.Tensor | None) -> None:
    """An ExecutionError naming the first computed index outside its table (one sync for all)."""
    if bounds is None:
        return
    for (n, rows), (lo, hi) in zip(checks, bounds.tolist()):
        index_in_bounds(n, rows, lo, hi)


def check_gather_indices(graph: Graph, value: Values, verified: frozenset[int] = frozenset()) -> None:
    """Range-check the indices of each GATHER that the program computes (less `verified`): on the
    GPU an out-of-range one reads zeros, on the CPU it is an error."""
    raise_out_of_bounds(*gather_index_bounds(graph, value, verified))


class KernelExecutor:
    """Runs a specialised graph with an engine's kernels; `launch(compiled, grid, args)` does the rest.

    With `replay`, the first run at an input signature records its launches and later runs at that
    signature replay them: no binding or variant checks per launch (tens of microseconds of Python
    each); an operand that is a view at an offset or a copy (a reshape of a transposed value) is
    computed again from its sources. Graphs with run-time INDEX/UNINDEX indices (scalars read back
    to the host) and runs with PyTorch operators (EXTERN) are never recorded."""

    def __init__(self, plans: list[KernelPlan], launch: Callable[[Compiled, tuple, list], None],
                 device: torch.device, replay: bool = False, collective: Collective | None = None,
                 row_blocks: int = 1, min_block_bytes: int = 0, world: int = 1) -> None:
        self.plans = plans
        self.launch = launch
        self.device = device
        self.replay = replay and collective is None
        self.collective = collective    # one rank of an SPMD run: see `Values`
        # SPMD (`world` ranks): a matmul whose product is all-reduced or reduce-scattered runs in up
        # to `row_blocks` blocks of rows, each block's collective (at least `min_block_bytes`)
        # issued as soon as its kernels are launched, so the transfer of one block overlaps the next
        # block's compute (`_blocked`).
        self.row_blocks, self.min_block_bytes = row_blocks, min_block_bytes
        self.world = world
        self.split_collectives = 0      # after a run: how many collectives went in several blocks
        # node id -> (index of the plan step that makes it, its position among that step's outputs)
        self._made = made_by(plans)
        # Check mode: a GATHER whose indices the program computed (no input check saw them) has
        # them range-checked after the run (one device sync), where a kernel would read zeros.
        self.check_indices = False
        # Set to () before a run: after it, the computed indices' bounds (`gather_index_bounds`),
        # queued on the device for an asynchronous check (verdicts.py) instead of checked here.
        self.deferred: tuple | None = None
        # Check mode: the kernels that store the engine's floating-point outputs raise one flag word
        # on a NaN or Inf (`flags`, after a run: read it once); `covered(graph)` names the outputs
        # they guard (the rest, made by no kernel, are scanned).
        self.check_outputs = False
        self.flags: torch.Tensor | None = None
        self._unflagged: torch.Tensor | None = None
        self._guards: dict[int, tuple[Graph, frozenset[int], frozenset[int]]] = {}
        self._replays: dict[tuple, Replay] = {}
        self._dynamic: dict[int, tuple[Graph, bool]] = {}
        self._key_parts: dict[str, tuple[torch.Tensor, tuple]] = {}    # stable input -> (tensor, its key part)
        self._consts: dict[tuple, torch.Tensor] = {}
        self._frees: dict[int, tuple[Graph, list[tuple[int, ...]]]] = {}
        # Each value a kernel made is dropped after its last reader (`lifetimes`): the run's peak
        # memory is what is live at once. Off on one rank of an SPMD run (collectives in flight).
        self.drop = True
        self._verified: dict[int, tuple[Graph, frozenset[int]]] = {}   # see `_verified_in`
        # `runtime.profile.Profiler` while a run is profiled: each launch bracketed by CUDA events,
        # nothing replayed (a replay's launches are not told apart).
        self.profiler = None
        self.on_alloc: Callable[[list[torch.Tensor]], None] | None = None   # told of each step's outputs (a capture)

    def _go(self, index: int, plan: KernelPlan, graph: Graph, launch: Launch, chosen: Compiled, grid: tuple,
            args: list) -> None:
        """Launch one kernel, through the profiler when one is listening."""
        if self.profiler is None:
            self.launch(chosen, grid, args)
            return
        from .profile import launch_cost
        flops, moved, dtype = launch_cost(plan.spec, launch)
        self.profiler.timed(f"k{index}", plan.spec.name, _where(graph, plan.binding.outputs),
                            lambda: self.launch(chosen, grid, args), flops=flops, nbytes=moved, dtype=dtype)

    def run(self, graph: Graph, inputs: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        key = self._key(graph, inputs) if self.replay and self.profiler is None else None
        known = self._replays.get(key) if key is not None else None
        if known is not None and known.graph is graph:
            return self._replay(graph, known, inputs)

        value = Values(graph, self._base(inputs), collective=self.collective)
        memo: dict = {}                 # multi-result PyTorch operators (EXTERN): called once per run
        ready = self._collectives_ready(graph) if self.collective is not None else {}
        blocked = self._blocked(graph)
        self.split_collectives = 0
        for n in ready.get(-1, ()):
            value.start(n)              # collectives of inputs: in flight while the first kernels run
        sources: dict[int, tuple] = {t.data_ptr(): ("in", name) for name, t in inputs.items()}
        steps: list | None = [] if key is not None and len(sources) == len(inputs) else None
        flags, guarded = self._flags(graph)
        sources[flags.data_ptr()] = ("flags",) if flags.data_ptr() not in sources else ("?",)
        dropped = self._dropped(graph)
        for index, plan in enumerate(self.plans):
            if index and dropped:
                release(value.vals, dropped[index - 1], self._made, sources)
            if isinstance(plan, ExternStep):
                from .extern import call
                n = graph.node(plan.node)
                if self.profiler is None:
                    value[n.id] = call(n, [value(i) for i in n.inputs], self.device, memo)
                else:
                    args_in = [value(i) for i in n.inputs]
                    value[n.id] = self.profiler.timed(f"x{index}", f"torch {str(n.attr('call'))[:60]}",
                                                      _where(graph, [n.id]),
                                                      lambda: call(n, args_in, self.device, memo))
                steps = None            # torch allocates its own outputs: nothing to replay
                for c in ready.get(index, ()):
                    value.start(c)
                continue
            shapes = [(tuple(graph.node(nid).shape), TORCH_DTYPES[graph.node(nid).dtype]) for nid in plan.binding.outputs]
            outs = [torch.empty(shape, dtype=dt, device=self.device) for shape, dt in shapes]
            if self.on_alloc is not None:
                self.on_alloc(outs)
            launch = bind(plan, graph, value, outs, flags, self._checks(plan, guarded))
            if index in blocked:        # block by block of rows, launches and transfers interleaved
                self._launch_blocked(index, graph, plan, launch, outs, blocked[index], value)
                for n in ready.get(index, ()):
                    value.start(n)
                continue                # (SPMD ranks record no replays)
            chosen = choose(plan, launch)
            grid = grid_for(chosen, plan.spec, launch)
            args = arguments(chosen, launch)
            if all(grid):
                self._go(index, plan, graph, launch, chosen, grid, args)
            for nid, t in zip(plan.binding.outputs, outs):
                value[nid] = t
            for n in ready.get(index, ()):
                value.start(n)          # its input exists now: the transfer overlaps the next kernels
            steps = record(steps, sources, index, plan, chosen, grid, args, outs, shapes, value)
            launch = args = None        # (they hold the operands: dropped values must go with the next step)
        if steps is not None:
            remember(self._replays, key, graph, steps)
        outputs = _outputs(graph, value, self._consts)
        for nid in list(value.pending):
            value(nid)                  # every rank finishes every collective it issued
        if self.deferred is not None:
            self.deferred = self._bounds(graph, value)
        elif self.check_indices:
            self._check_indices(graph, value)
        return outputs

    def _verified_in(self, graph: Graph) -> frozenset[int]:
        """The GATHERs of `graph` whose indices follow from its shapes alone (`native.shape_only`)
        and that a checked run found in range: the same every run, never checked again (ResNet-50's
        17 im2col gathers: a reduction over each one's indices and a sync every call)."""
        known = self._verified.get(id(graph))
        return known[1] if known is not None and known[0] is graph else frozenset()

    def _bounds(self, graph: Graph, value: Values) -> tuple:
        """`gather_index_bounds` for a deferred check. The shape-only gathers are in it once: their
        indices are the same every run, so the first run's check speaks for all."""
        out = gather_index_bounds(graph, value, self._verified_in(graph))
        known = self._verified.get(id(graph))
        if known is None or known[0] is not graph:
            self._verified[id(graph)] = (graph, shape_only_gathers(graph))
        return out

    def _check_indices(self, graph: Graph, value: Values) -> None:
        known = self._verified.get(id(graph))
        check_gather_indices(graph, value, known[1] if known is not None and known[0] is graph else frozenset())
        if known is None or known[0] is not graph:
            self._verified[id(graph)] = (graph, shape_only_gathers(graph))

    def _dropped(self, graph: Graph) -> list[tuple[int, ...]] | None:
        """Per plan step, the values to drop once it is launched (`lifetimes.frees`), once per
        graph; None when nothing is dropped."""
        if not self.drop or self.collective is not None:
            return None
        known = self._frees.get(id(graph))
        if known is None or known[0] is not graph:
            known = self._frees[id(graph)] = (graph, frees(graph, self.plans, self._made))
        return known[1]

    def _blocked(self, graph: Graph) -> dict[int, "Blocks"]:
        """The collectives issued by the kernel that makes their input, block by block of its rows:
        plan index -> Blocks. An all-reduce whose input nothing else reads (not a graph output)
        sums in place into the kernel's buffer, in row blocks where the kernel is a 2-D matmul's
        (no batch dims, no gathered operands), else whole. A reduce-scatter along rows of a 2-D
        matmul's product runs in blocks too: block b holds the b-th rows of every rank's part, so
        each block's reduce-scatter fills rows of this rank's result. A kernel whose outputs meet
        both kinds, or a collective it cannot block, keeps the usual path (one collective, issued
        after the kernel)."""
        if self.collective is None:
            return {}
        users = graph.users()
        outputs = set(tree_ids(graph.output))
        made = self._made
        found: dict[int, list[tuple[Node, int]]] = {}
        for n in graph.nodes:
            src = n.inputs[0] if n.op in (Op.ALL_REDUCE, Op.REDUCE_SCATTER) else None
            if src not in made or isinstance(self.plans[made[src][0]], ExternStep) or graph.node(src).dtype == "bool":
                continue                # (torch allocates an EXTERN's result: not a kernel's buffer)
            if n.op is Op.ALL_REDUCE and (users[src] != [n.id] or src in outputs):
                continue
            if n.op is Op.REDUCE_SCATTER and n.attr("dim") != 0:
                continue
            found.setdefault(made[src][0], []).append((n, made[src][1]))
        out: dict[int, Blocks] = {}
        for index, nodes in found.items():
            kinds = {n.op for n, _ in nodes}
            if len(kinds) > 1:
                continue
            rows = block_rows(self.plans[index], graph)
            src = graph.node(nodes[0][0].inputs[0])
            row_bytes = math.prod(src.shape[1:]) * TORCH_DTYPES[src.dtype].itemsize
            most = self.row_blocks
            if self.min_block_bytes:    # blocks whose transfers are too small to pay for themselves: fewer
                most = min(most, rows * row_bytes // self.min_block_bytes)
            if Op.REDUCE_SCATTER in kinds:
                part = rows // self.world if rows and rows % self.world == 0 else 0
                spans = _spans(self.plans[index], part, most)
                if len(spans) > 1:
                    out[index] = Blocks(nodes, [[(r * part + a, r * part + b) for r in range(self.world)]
                                                for a, b in spans], spans)
            else:
                spans = _spans(self.plans[index], rows, most)
                out[index] = Blocks(nodes, [[span] for span in spans] if len(spans) > 1 else [[]], spans)
        return out

    def _launch_blocked(self, index: int, graph: Graph, plan: KernelPlan, launch: Launch, outs: list[torch.Tensor],
                        blocks: "Blocks", value: Values) -> None:
        """Launch `plan` block by block (see `_blocked`), each block's collectives issued right after
        its launches; their consumers wait for every block."""
        assert self.collective is not None
        waits: dict[int, list] = {n.id: [] for n, _ in blocks.nodes}
        results: dict[int, torch.Tensor] = {}
        for n, _pos in blocks.nodes:
            if n.op is Op.REDUCE_SCATTER:
                results[n.id] = torch.empty(tuple(n.shape), dtype=TORCH_DTYPES[n.dtype], device=self.device)
        for ranges, (b0, b1) in zip(blocks.launches, blocks.spans):
            for r0, r1 in ranges or [(0, 0)]:
                part = rows_of(launch, plan.spec, r0, r1) if ranges else launch
                chosen = choose(plan, part)
                grid = grid_for(chosen, plan.spec, part)
                if all(grid):
                    self._go(index, plan, graph, part, chosen, grid, arguments(chosen, part))
            for n, pos in blocks.nodes:
                if n.op is Op.ALL_REDUCE:
                    piece = outs[pos][ranges[0][0]:ranges[0][1]] if ranges else outs[pos]
                    waits[n.id].append(self.collective(n, piece, True))
                else:       # this block's rows of every rank's part -> its rows of this rank's part
                    pieces = [outs[pos][r0:r1] for r0, r1 in ranges]
                    waits[n.id].append(self.collective(n, pieces, into=results[n.id][b0:b1]))
        for nid, t in zip(plan.binding.outputs, outs):
            value[nid] = t
        for n, pos in blocks.nodes:
            value.pending[n.id] = _all_done(waits[n.id], results.get(n.id, outs[pos]))
        self.split_collectives += len(blocks.nodes) if len(blocks.spans) > 1 else 0

    def _collectives_ready(self, graph: Graph) -> dict[int, list[Node]]:
        """Each collective by the index of the last step whose output it needs (-1: inputs only),
        in graph order, so that every rank issues them in the same sequence."""
        def after(nid: int) -> int:
            n = graph.node(nid)
            if nid in self._made:
                return self._made[nid][0]
            if n.op in VIEWS:
                return max([after(i) for i in n.inputs] + [-1])
            return -1
        ready: dict[int, list[Node]] = {}
        for n in graph.nodes:
            if n.op in COLLECTIVE:
                ready.setdefault(after(n.inputs[0]), []).append(n)
        return ready

    def _base(self, inputs: dict[str, torch.Tensor]) -> Callable[[Node], torch.Tensor]:
        """Values that no kernel computes: inputs (contiguous) and constants."""
        def base(n: Node) -> torch.Tensor:
            if n.op is Op.INPUT:
                t = inputs[n.attr("name")]
                return t if t.is_contiguous() else t.contiguous()
            if n.op is Op.CONST:
                # made once per value: a host-to-device copy cannot happen inside a CUDA graph capture
                key = (repr(n.attr("value")), n.dtype)
                if key not in self._consts:
                    self._consts[key] = torch.tensor(n.attr("value"), dtype=TORCH_DTYPES[n.dtype], device=self.device)
                return self._consts[key]
            raise ExecutionError(f"internal: %{n.id} (`{n.op.value}`) is read before a kernel writes it")
        return base

    def _key(self, graph: Graph, inputs: dict[str, torch.Tensor], stable: frozenset[str] = frozenset()) -> tuple | None:
        """The launches' key: per input its shape, strides, dtype, device and alignment. `stable`
        names inputs whose tensors persist between runs (an engine's weights): their part is
        remembered per tensor object, not described again at every run."""
        dynamic = self._dynamic.get(id(graph))
        if dynamic is None or dynamic[0] is not graph:
            dynamic = self._dynamic[id(graph)] = (graph, any(n.op in (Op.INDEX, Op.UNINDEX) and len(n.inputs) > 1
                                                             for n in graph.nodes))
        if dynamic[1]:
            return None                 # run-time indices: the launch depends on their values
        # A GATHER's indices are tensor data its kernel reads: its launches depend on shapes alone.
        # (In the inputs' own order: an engine's runs list them alike; another order only misses.)
        memo = self._key_parts
        parts = []
        for name, t in inputs.items():
            if name in stable:
                known = memo.get(name)
                if known is not None and known[0] is t:
                    parts.append(known[1])
                    continue
            part = (name, t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)
            if name in stable:
                memo[name] = (t, part)
            parts.append(part)
        return (id(graph), self.check_outputs, *parts)

    def covered(self, graph: Graph) -> frozenset[int]:
        """The graph's outputs whose values a kernel stores, so check mode's flag word guards them."""
        return self._guard(graph)[2]

    def _guard(self, graph: Graph) -> tuple[Graph, frozenset[int], frozenset[int]]:
        """(graph, the kernel outputs that hold the graph's floating-point outputs, the graph outputs
        so guarded), once per graph: an output that is a reshape or transpose of a kernel's output is
        that output's (a slice is not: the flag would see the elements it leaves out)."""
        known = self._guards.get(id(graph))
        if known is None or known[0] is not graph:
            known = self._guards[id(graph)] = (graph, *guarded_outputs(graph, self.plans, self._made))
        return known

    def _flags(self, graph: Graph) -> tuple[torch.Tensor, frozenset[int]]:
        """This run's flag word (zeroed; in check mode) or a word no kernel writes, and the kernel
        outputs that raise it."""
        if not self.check_outputs:
            if self._unflagged is None:
                self._unflagged = torch.zeros(1, dtype=torch.int32, device=self.device)
            self.flags = None
            return self._unflagged, frozenset()
        self.flags = torch.zeros(1, dtype=torch.int32, device=self.device)
        return self.flags, self._guard(graph)[1]

    _checks = staticmethod(check_bits)

    def _replay(self, graph: Graph, known: Replay, inputs: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        produced: list[list[torch.Tensor]] = []
        value = Values(graph, self._base(inputs))
        flags, _guarded = self._flags(graph)
        dropped = self._dropped(graph)
        for index, (plan, (chosen, grid, rec, shapes)) in enumerate(zip(self.plans, known.steps)):
            if index and dropped:
                release(value.vals, dropped[index - 1], self._made)
                for nid in dropped[index - 1]:
                    at = self._made.get(nid)
                    if at is not None and at[0] < len(produced):
                        produced[at[0]][at[1]] = None
            outs = [torch.empty(shape, dtype=dt, device=self.device) for shape, dt in shapes]
            produced.append(outs)
            args = replay_args(rec, inputs, produced, value, flags)
            if all(grid):
                self.launch(chosen, grid, args)
            args = None
            for nid, t in zip(plan.binding.outputs, outs):
                value[nid] = t
        if self.deferred is not None:
            self.deferred = self._bounds(graph, value)
        elif self.check_indices:
            self._check_indices(graph, value)
        return _outputs(graph, value, self._consts)


@dataclass
class Blocks:
    """How a kernel runs with the collectives of its outputs (`KernelExecutor._blocked`): per block,
    the row ranges to launch (empty: the whole launch, one block) and the rows of the collective's
    result it makes (`spans`: the block's rows within one rank's part, for a reduce-scatter)."""
    nodes: list[tuple[Node, int]]           # (collective, position of its input among the outputs)
    launches: list[list[tuple[int, int]]]
    spans: list[tuple[int, int]]


def _spans(plan: KernelPlan, rows: int, most: int) -> list[tuple[int, int]]:
    """`rows` in up to `most` ranges of whole tiles (the largest BLOCK_M of the kernel's variants);
    one range where that makes fewer than two."""
    tile = max((c.config.get("BLOCK_M", 0) for c in plan.variants), default=0) or 128
    tiles = -(-rows // tile)
    if most < 2 or tiles < 2:
        return [(0, rows)]
    step = -(-tiles // min(most, tiles)) * tile
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


def _all_done(waits: list, whole: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Wait for every block's transfer (in issue order); the value is the whole buffer."""
    def wait() -> torch.Tensor:
        for w in waits:
            if not isinstance(w, torch.Tensor):
                w()
        return whole
    return wait


def nonfinite(values: dict[int, torch.Tensor]) -> int | None:
    """The first floating-point value holding NaN or Inf, or None: each read once (its min and
    max, which NaN and Inf reach), one device sync for all of them."""
    floats = [(nid, v) for nid, v in values.items() if v.dtype.is_floating_point and v.numel()]
    if not floats:
        return None
    ends = torch.stack([torch.stack(torch.aminmax(v)).float() for _, v in floats])
    finite = torch.isfinite(ends).all(dim=1).tolist()
    return next((nid for (nid, _), ok in zip(floats, finite) if not ok), None)


def check_outputs(kernels: KernelExecutor, graph: Graph, inputs: dict[str, torch.Tensor],
                  values: dict[int, torch.Tensor], flags: torch.Tensor | None) -> None:
    """Check mode after a run: the kernels that stored the outputs raised `flags` on a NaN or Inf
    (one word read, one sync); outputs no kernel stored are scanned. On a hit the program runs
    again on the CPU reference, op by op, which names the op that made the first NaN and its
    source line (fused kernels keep their intermediates in registers)."""
    covered = kernels.covered(graph)
    raised = flags is not None and bool(flags.item())
    bad = nonfinite({nid: v for nid, v in values.items() if nid not in covered})
    if bad is None and not raised:
        return
    if bad is None:
        bad = nonfinite(values)
    cpu_inputs = {k: v.cpu() for k, v in inputs.items()}
    try:
        CpuExecutor(check=True, timings=False).run(graph, cpu_inputs)
    except ExecutionError as exc:
        raise ExecutionError(f"{exc} (seen on the {next(iter(values.values())).device.type.upper()}'s kernels, "
                             "traced on the CPU reference)") from None
    where = f" (node %{bad})" if bad is not None else ""
    raise ExecutionError(f"check failed: an output holds NaN/Inf in the kernels' result{where} but not on the "
                         "CPU reference: the kernels' result is wrong")


@dataclass
class Captured:
    """One input signature's run, captured as a CUDA graph: replayed with one launch."""
    graph: Graph
    cuda_graph: Any                     # torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]     # the tensors the graph reads: its own copies, and stable inputs
    copied: tuple[str, ...]             # inputs copied in before each replay (the rest: rebound or stable)
    outputs: dict[int, torch.Tensor]    # the graph's output buffers (the unbound ones cloned out after each replay)
    bounds: tuple = ([], None)          # computed gather indices' tables and [min, max], filled by each replay
    flags: torch.Tensor | None = None   # check mode's NaN/Inf word, zeroed and raised by each replay
    binder: Any = None                  # rebind.Binder: the nodes pointed at each run's inputs and outputs
    fresh: dict = field(default_factory=dict)   # output id -> (buffer key, bytes, dtype, shape, stride, offset)


class CudaExecutor:
    """An engine's kernels on torch's current CUDA device, launched through the CUDA driver.

    An input signature's first run launches kernel by kernel; the second captures the run as a
    CUDA graph, and later runs replay it with one launch. The graph reads the caller's inputs and
    writes outputs the caller then owns, its kernel nodes pointed at this run's tensors
    (`rebind.Binder`); a buffer that PyTorch operators touch inside the graph is copied in (an
    input) or cloned out (an output) instead. `stable` names the inputs whose tensors persist
    between runs (an engine's weights): the graph reads them in place. Graphs with run-time
    indices, or whose capture fails, keep launching kernel by kernel. Engines run this way by
    default (`XG_CUDA_GRAPHS=0` turns capture off; `graphs=` here).

    Nothing here waits for the GPU unless asked (`wait`): check mode's evidence is queued to the
    host behind each run and read later (`verdicts.py`)."""
    name = "cuda"

    def __init__(self, plans: list[KernelPlan], check: bool = True, graphs: bool = False) -> None:
        from .cuda import KernelLauncher
        self.plans = plans
        self.check = check
        self.graphs = graphs
        self.stable: frozenset[str] = frozenset()
        self.kept: dict[str, torch.Tensor] = {}         # the stable inputs' tensors (an engine's weights)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.launcher = KernelLauncher(self.device.index)
        self._captured: dict[tuple, Captured] = {}      # least recently used first
        self._lock = threading.Lock()
        self._warm: set[tuple] = set()
        self._uncapturable: set[tuple] = set()
        self.capture_failure: str | None = None     # why the last capture failed (runs then launch kernel by kernel)
        self.rebind_failure: str | None = None      # why the last capture copies its inputs and clones its outputs
        self.verdicts = Verdicts()
        self._box: Mailbox | None | bool = None

        def launch(c: Compiled, grid: tuple, args: list) -> None:
            self.launcher.launch(c.handle, grid, args)
        self.kernels = KernelExecutor(plans, launch, self.device, replay=True)

    def run(self, graph: Graph, inputs: dict[str, torch.Tensor], wait: bool = True, profiler=None,
            ranges: list | None = None) -> RunOutput:
        """Runs the kernels on torch's current stream; `wait` synchronises first (timings are then
        real) and reads this run's check. `profiler` (`runtime.profile.Profiler`): time each launch,
        kernel by kernel (no CUDA graph). `ranges`: the index inputs' (name, lo, hi, [min, max] on
        the device), checked with the rest. The returned output's `pending` is the run's check."""
        t0 = time.perf_counter()
        self.verdicts.settle_ready()            # the earlier runs that have finished: their checks
        self.kernels.check_outputs = self.check
        self.kernels.check_indices = False
        self.kernels.deferred = () if self.check else None
        try:
            if profiler is not None:
                self.kernels.profiler = profiler
                try:
                    values, flags, bounds = self.kernels.run(graph, inputs), self.kernels.flags, self.kernels.deferred
                finally:
                    self.kernels.profiler = None
            else:
                values, flags, bounds = self._values(graph, inputs)
        finally:
            self.kernels.deferred = None
        pending = None
        if self.check or ranges:
            pending = Pending(graph, inputs, self._evidence(graph, values, flags, bounds, ranges or []),
                              self._mailbox(), self.launcher._current_stream(), self.kept)
            self.verdicts.add(pending)
        if wait:
            torch.cuda.synchronize(self.device)
            self.verdicts.settle_through(pending, later=False)
        out = RunOutput(values, [{"op": "kernels", "launches": len(self.plans), "ms": (time.perf_counter() - t0) * 1e3}])
        out.pending = pending
        return out

    def _mailbox(self) -> Mailbox | None:
        """The pinned slots checks are read through, made at the first checked run (None: the
        driver refused them; checks then go through torch's pinned memory and events)."""
        if self._box is None:
            try:
                self._box = Mailbox(self.launcher._enter, self.launcher._exit)
            except CudaRuntimeError:
                self._box = False
        return self._box or None

    def settle(self, pending: Pending | None = None) -> None:
        """Wait for the checks of the runs up to `pending` (every run, when None) and raise the
        first failure."""
        self.verdicts.settle_through(pending, later=pending is None)

    def _evidence(self, graph: Graph, values: dict[int, torch.Tensor], flags: torch.Tensor | None, bounds,
                  ranges: list) -> Evidence:
        if not self.check:
            return Evidence(ranges=ranges)
        _graph, stored, covered = self.kernels._guard(graph)

        def stored_by() -> str:         # (only for a failure's message)
            by = [_where(graph, p.binding.outputs) for p in self.plans
                  if not isinstance(p, ExternStep) and any(nid in stored for nid in p.binding.outputs)]
            return "; ".join(by[:3])
        return Evidence(flags=flags,
                        unguarded=[(nid, v) for nid, v in values.items()
                                   if nid not in covered and v.dtype.is_floating_point and v.numel()],
                        gathers=bounds or ([], None), ranges=ranges, stored_by=stored_by)

    def _values(self, graph: Graph, inputs: dict[str, torch.Tensor]) -> tuple[dict[int, torch.Tensor],
                                                                                torch.Tensor | None, tuple | None]:
        """The run's outputs, its check-mode flag word (None with checks off) and its computed
        indices' bounds (None: none checked)."""
        key = self.kernels._key(graph, inputs, self.stable) if self.graphs else None
        if key is None:
            return self.kernels.run(graph, inputs), self.kernels.flags, self.kernels.deferred
        with self._lock:                        # a graph's buffers serve one run at a time
            cap = self._captured.pop(key, None)
            if cap is not None:
                if cap.graph is graph and all(inputs[n] is cap.inputs[n] or inputs[n].data_ptr() == cap.inputs[n].data_ptr()
                                              for n in self.stable if n in cap.inputs):
                    self._captured[key] = cap   # most recently used last: evicted last
                    try:
                        return self._replay(cap, inputs)
                    except CudaRuntimeError as exc:     # a node could not be pointed at this run's tensors
                        self.rebind_failure = str(exc)
                        self._uncapturable.add(key)
                        del self._captured[key]
                        return self.kernels.run(graph, inputs), self.kernels.flags, self.kernels.deferred
                # a stable input moved: capture again (below)
            if key in self._uncapturable or key not in self._warm:
                self._warm.add(key)             # the first run loads every module: never inside a capture
                return self.kernels.run(graph, inputs), self.kernels.flags, self.kernels.deferred
            cap = self._capture(graph, inputs)
            if cap is None:
                self._uncapturable.add(key)
                return self.kernels.run(graph, inputs), self.kernels.flags, self.kernels.deferred
            if len(self._captured) >= MAX_GRAPHS:
                old = next(iter(self._captured))
                del self._captured[old]
                self._warm.discard(old)         # warm it again before capturing it again
            self._captured[key] = cap
            return self._replay(cap, inputs)

    def _replay(self, cap: Captured, inputs: dict[str, torch.Tensor]) -> tuple[dict[int, torch.Tensor],
                                                                                torch.Tensor | None, tuple | None]:
        for n in cap.copied:
            cap.inputs[n].copy_(inputs[n])
        outputs: dict[int, torch.Tensor] = {}
        if cap.binder is not None:
            addresses = {("in", n): inputs[n].data_ptr() for n in cap.binder.inputs}
            buffers: dict = {}
            for nid, (key, nbytes, dtype, shape, stride, offset, whole) in cap.fresh.items():
                if whole:                       # the output is its buffer: allocated as it is
                    out = outputs[nid] = torch.empty_strided(shape, stride, dtype=dtype, device=self.device)
                    addresses[key] = out.data_ptr()
                    continue
                buf = buffers.get(key)
                if buf is None:
                    buf = buffers[key] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                    addresses[key] = buf.data_ptr()
                outputs[nid] = torch.empty(0, dtype=dtype, device=self.device).set_(
                    buf.untyped_storage(), offset, shape, stride)
            cap.binder.bind(addresses)
        cap.cuda_graph.replay()
        for nid, t in cap.outputs.items():
            if nid not in outputs:
                outputs[nid] = t.clone()
        return outputs, cap.flags, cap.bounds if self.check else None

    def _capture(self, graph: Graph, inputs: dict[str, torch.Tensor]) -> Captured | None:
        copied = tuple(sorted(n for n in inputs if n not in self.stable))
        if any(inputs[n].data_ptr() % 16 for n in copied):
            self.capture_failure = "an input is not 16-byte aligned"
            return None     # the graph's own (aligned) copies could pick other variants than this input's
        static = {n: (t.clone() if n in copied else t) for n, t in inputs.items()}
        cuda_graph = torch.cuda.CUDAGraph(keep_graph=True)
        replay, self.kernels.replay = self.kernels.replay, False
        deferred = self.kernels.deferred
        self.kernels.deferred = ()      # computed indices: their bounds captured too, checked after each replay
        touches = TorchTouches()
        self.launcher.recording = launches = []
        births: dict[int, int] = {}     # storage address -> launches before its latest allocation there
        self.kernels.on_alloc = lambda outs: births.update((t.untyped_storage().data_ptr(), len(launches)) for t in outs)
        try:
            with torch.cuda.graph(cuda_graph, capture_error_mode="thread_local"):
                with touches:
                    outputs = self.kernels.run(graph, static)
            bounds = self.kernels.deferred or ([], None)
            flags = self.kernels.flags      # zeroed by the graph itself on every replay
            cuda_graph.instantiate()
        except (RuntimeError, XGError) as exc:
            torch.cuda.synchronize(self.device)
            self.capture_failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            return None             # something in the run cannot be captured: launch kernel by kernel
        finally:
            self.kernels.replay = replay
            self.kernels.deferred = deferred
            self.launcher.recording = None
            self.kernels.on_alloc = None
        cap = Captured(graph, cuda_graph, static, copied, outputs, bounds, flags)
        self._bind(cap, launches, touches.storages, births)
        return cap

    def _bind(self, cap: Captured, launches: list, touched: set[int], births: dict[int, int]) -> None:
        """Point `cap`'s graph at each run's own tensors (`rebind.Binder`) where it can: the copied
        inputs and the outputs that only its kernels touch. An output's buffer is in the capture's
        memory pool, where an intermediate freed earlier may have lived at the same addresses: only
        the launches from its allocation on (`births`) are its own."""
        buffers, fresh = plan_buffers(cap.inputs, cap.copied, cap.outputs, touched, births)
        if not buffers:
            return
        binder = Binder.build(cap.cuda_graph, launches, buffers, self.launcher._enter, self.launcher._exit)
        if isinstance(binder, str):
            self.rebind_failure = binder
            return
        bound = binder.keys
        cap.binder = binder
        cap.copied = tuple(n for n in cap.copied if ("in", n) not in bound)
        cap.fresh = {nid: f for nid, f in fresh.items() if f[0] in bound}
        self.rebind_failure = None
