"""The SPMD executor: one rank's part of a sharded engine, with real collectives.

Every rank runs the same graph on its own pieces. The plan is read back from the graph
(`ir.layout.infer_layouts`): each node is given its *local* shape (a sharded dim divided by the
world size) and runs through the CPU reference executor's op implementations (torch; on the
rank's GPU when the device is cuda). Collective ops go through `torch.distributed` (gloo on CPU,
NCCL on GPU) asynchronously: a collective starts as soon as its input exists and is waited for
only when a consumer needs its result, so it overlaps whatever compute does not depend on it (with
NCCL the transfer runs on NCCL's own CUDA stream; `wait` only orders the compute stream after it).

With `kernels` (a CUDA rank of an engine that carries kernels, the default there), the rank runs
the engine's own tuned kernels instead, on its local shapes, through `gpu.KernelExecutor`: each
collective is issued as soon as the kernel that produces its input is launched and waited for when
a later kernel first reads it. (`XG_SPMD_KERNELS=0` keeps torch's ops; `XG_SPMD_KERNELS=interpret`
runs the kernels under Triton's interpreter on CPU ranks, to check a sharded engine's kernel path
without GPUs.)
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from datetime import timedelta
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist

from ..compiler.ir.graph import Graph, Node, Op, tree_ids
from ..compiler.ir.layout import Layout, infer_layouts, local_shape, split_inputs
from ..compiler.ir.stages import Transfer, has_stages, stage_gpus, stage_of, stage_plan
from ..compiler.ir.serialize import where as src_text
from ..compiler.passes.shard import ShardingError
from ..errors import ExecutionError, InputError
from .cpu import CpuExecutor, RunOutput


@dataclass(frozen=True)
class Group:
    """This process's rank in an initialised default process group."""
    rank: int
    world: int
    device: str = "cpu"          # "cpu" or "cuda:K"
    timeout_s: float | None = None   # the default group's timeout (groups made later take it too)


def local_graph(graph: Graph, world: int) -> tuple[Graph, dict[int, Layout]]:
    """`graph` with each node's shape replaced by one rank's piece of it (shapes concrete)."""
    layouts = infer_layouts(graph, world)
    by_name = split_inputs(graph)
    split = {nid: by_name[name] for name, nid in graph.inputs if name in by_name}
    nodes = []
    for n in graph.nodes:
        lay = layouts[n.id]
        if lay.kind == "S" and n.shape[lay.dim] % world:
            line = f" (line {n.src[0]})" if n.src else ""
            raise InputError(f"dimension {lay.dim} of %{n.id} (`{n.op.value}`{line}) has size {n.shape[lay.dim]}, "
                             f"which {world} ranks do not divide")
        if n.op is Op.INPUT and n.id in split:
            lay = Layout("S", split[n.id])
        nodes.append(replace(n, shape=local_shape(n.shape, lay, world)))
    return graph.with_nodes(nodes), layouts


class SpmdExecutor:
    """Runs one rank's part of a planned graph (see the module docstring); `stats` after a run:
    collectives started, milliseconds spent issuing and waiting for them, and in all."""

    def __init__(self, group: Group, *, float64: bool = False, check: bool = True, overlap: bool = True,
                 kernels: list | None = None, launch: Callable | None = None, kernel_mode: str = "",
                 row_blocks: int = 1, min_block_bytes: int = 0) -> None:
        self.group = group
        self.plans, self.launch = kernels, launch
        # kernels: a reduced matmul in up to `row_blocks` blocks of rows, each block's collective
        # at least `min_block_bytes` (runtime/gpu.py's KernelExecutor)
        self.row_blocks, self.min_block_bytes = row_blocks, min_block_bytes
        self.ops = CpuExecutor(float64=float64, check=check, timings=False)
        self.check = check
        self.overlap = overlap       # False: finish each collective before going on (measures overlap)
        self.name = "spmd-" + ("cuda" if group.device.startswith("cuda") else "cpu")
        if kernels is not None:
            self.name = f"spmd-kernels-{kernel_mode or self.name[5:]}"
        self.stats: dict = {}
        self._linked = False         # pipeline: pair links opened (once per executor)
        self._stage_groups: list = []  # pipeline with stages of several GPUs: each stage's process group

    def run(self, graph: Graph, inputs: dict[str, torch.Tensor], split: dict[str, int]) -> RunOutput:
        """Run `graph` (global shapes) on this rank; `inputs` are whole, except those in `split`,
        which are already this rank's slices. Returns this rank's pieces of the outputs."""
        if has_stages(graph) and self.group.world > 1:
            return self._run_stages(graph, inputs, split)
        if self.plans is not None:
            return self._run_kernels(graph, inputs, split)
        self.ops.memo = {}
        local, _ = local_graph(graph, self.group.world)
        split_ids = {nid for name, nid in graph.inputs if name in split}
        vals: dict[int, torch.Tensor] = {}
        pending: dict[int, tuple] = {}
        comm = {"collectives": 0, "wait_ms": 0.0, "issue_ms": 0.0}
        t_start = time.perf_counter()

        def value(i: int) -> torch.Tensor:
            if i in pending:
                work, finish, node = pending.pop(i)
                vals[i] = self._waiter(node, work, finish, comm)()
            return vals[i]

        order = _comm_early(local)
        outputs = set(tree_ids(local.output))
        last_use = {i: n.id for n in order for i in n.inputs}
        device = torch.device(self.group.device) if self.group.device != "cpu" else None
        with torch.no_grad(), (device if device is not None else nullcontext()):
            for n in order:
                args = [value(i) for i in n.inputs]
                if n.op is Op.SHARD and n.inputs[0] in split_ids:
                    vals[n.id] = args[0]            # loaded as this rank's slice already
                elif n.op in (Op.SHARD, Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL):
                    t0 = time.perf_counter()
                    started = self.collective(n, args[0])
                    comm["issue_ms"] += (time.perf_counter() - t0) * 1e3
                    if isinstance(started, torch.Tensor):
                        vals[n.id] = started
                    else:
                        comm["collectives"] += 1
                        pending[n.id] = (*started, n)
                        if not self.overlap:
                            value(n.id)
                else:
                    vals[n.id] = self.compute(n, args, inputs)
                if not self.check:     # free what no later node reads (check mode keeps all, to trace NaNs)
                    for i in n.inputs:
                        if last_use.get(i) == n.id and i not in outputs:
                            vals.pop(i, None)
            outs = {i: value(i) for i in tree_ids(local.output)}
            for i in list(pending):
                value(i)
        comm["total_ms"] = (time.perf_counter() - t_start) * 1e3
        self.stats = comm
        if self.check:
            self.ops.guard(local, vals)
        return RunOutput(outs, [])

    def _run_kernels(self, graph: Graph, inputs: dict[str, torch.Tensor], split: dict[str, int]) -> RunOutput:
        from .gpu import KernelExecutor
        local, _ = local_graph(graph, self.group.world)
        split_ids = {nid for name, nid in graph.inputs if name in split}
        comm = {"collectives": 0, "wait_ms": 0.0, "issue_ms": 0.0}
        t_start = time.perf_counter()
        on_gpu = self.group.device != "cpu"

        def collective(n: Node, x, in_place: bool = False, into: torch.Tensor | None = None):
            if n.op is Op.SHARD and n.inputs[0] in split_ids:
                return x                        # loaded as this rank's slice already
            t0 = time.perf_counter()
            started = self.collective(n, x, in_place, into)
            comm["issue_ms"] += (time.perf_counter() - t0) * 1e3
            if isinstance(started, torch.Tensor):
                return started
            comm["collectives"] += 1
            wait = self._waiter(n, *started, comm)
            return wait() if not self.overlap else wait

        device = torch.device(self.group.device)
        executor = KernelExecutor(self.plans, self.launch, device, collective=collective,
                                  row_blocks=self.row_blocks if self.overlap else 1,
                                  min_block_bytes=self.min_block_bytes, world=self.group.world)
        with torch.no_grad(), (device if on_gpu else nullcontext()):
            outs = executor.run(local, inputs)
        comm["split_collectives"] = executor.split_collectives
        if self.check:
            bad = [i for i, v in outs.items() if v.dtype.is_floating_point and not bool(torch.isfinite(v).all())]
            if bad:
                raise ExecutionError(f"check failed: output %{bad[0]} holds NaN/Inf on rank {self.group.rank}; "
                                     "rerun with XG_SPMD_KERNELS=0 to trace its origin op by op")
        comm["total_ms"] = (time.perf_counter() - t_start) * 1e3
        self.stats = comm
        return RunOutput(outs, [])

    def _run_stages(self, graph: Graph, inputs: dict[str, torch.Tensor],
                    split: dict[str, int] | None = None) -> RunOutput:
        """A pipeline plan's part on this rank (ir/stages.py): its stage's tasks in order (with
        microbatches, each per-microbatch node once per microbatch, stage by stage overlapping);
        values cross GPUs by point-to-point sends to the same replica's GPU of the other stage,
        posted for each pair in the order both agree on, so they always pair up. With stages of
        several GPUs, combinations over microbatches also combine the stage's replicas (a
        collective in the stage's group); `split` names the inputs loaded as this replica's share.
        Outputs arrive on stage 0 (other ranks return the outputs they computed)."""
        self.name = "pipeline-" + ("cuda" if self.group.device.startswith("cuda") else "cpu")
        rank = self.group.rank
        where = stage_of(graph, rank)
        gpus = stage_gpus(graph)
        if where is None:               # a GPU in no stage (a plan that leaves a stage number out)
            if not self._linked:
                self._make_groups(gpus)     # every rank takes part in making them
                self._linked = True
            self.stats = {"collectives": 0, "wait_ms": 0.0, "issue_ms": 0.0, "sends": 0, "bytes_sent": 0,
                          "microbatches": 1, "tasks": 0, "total_ms": 0.0}
            return RunOutput({}, [])
        stage, replica = where
        try:
            plan = stage_plan(graph, stage)
        except ShardingError as exc:     # a symbolic batch that the microbatches do not divide
            raise InputError(str(exc)) from None
        g, parts = plan.graph, plan.parts
        peer_rank = {k: ranks[replica] for k, ranks in enumerate(gpus)}
        outputs = tree_ids(g.output)
        vals: dict[tuple, torch.Tensor] = {}
        arrived: dict[tuple, tuple] = {}
        sent: list = []
        memos: dict = {}
        cursor = {peer: 0 for peer in plan.pairs}
        comm = {"collectives": 0, "wait_ms": 0.0, "issue_ms": 0.0, "sends": 0, "bytes_sent": 0,
                "microbatches": parts, "tasks": len(plan.tasks)}
        t_start = time.perf_counter()
        device = torch.device(self.group.device) if self.group.device != "cpu" else torch.device("cpu")

        def post(peer: int, upto: int) -> None:
            """Post this pair's transfers up to `upto` (receives start at once; a send's value is
            computed by then: ir/stages.py orders them so)."""
            seq = plan.pairs[peer]
            while cursor[peer] <= upto:
                t: Transfer = seq[cursor[peer]]
                cursor[peer] += 1
                node = g.node(t.value)
                t0 = time.perf_counter()
                try:
                    if t.dst == stage:
                        buf, back = _wire(torch.empty(tuple(node.shape), dtype=self.ops.dtype(node.dtype),
                                                      device=device))
                        arrived[t.key] = (dist.irecv(buf, src=peer_rank[peer], tag=t.seq), buf, back)
                    else:
                        wire = _wire(ready(t.key))[0].contiguous()
                        sent[:] = [(w, x) for w, x in sent if not w.is_completed()]   # free what arrived
                        sent.append((dist.isend(wire, dst=peer_rank[peer], tag=t.seq), wire))
                        comm["sends"] += 1
                        comm["bytes_sent"] += wire.numel() * wire.element_size()
                except RuntimeError as exc:
                    raise ExecutionError(f"sending %{t.value}{_at(node)} from GPU {peer_rank[t.src]} to GPU "
                                         f"{peer_rank[t.dst]} failed on rank {rank}: {_first_line(exc)}") from None
                comm["issue_ms"] += (time.perf_counter() - t0) * 1e3

        def ready(key: tuple) -> torch.Tensor:
            """A value computed here (a collective's result once it has arrived)."""
            v = vals[key]
            if isinstance(v, _Later):
                v = vals[key] = v.get()
            return v

        def value(key: tuple) -> torch.Tensor:
            if key not in vals and key in plan.recv:
                t = plan.recv[key]
                post(t.src, t.seq)
                work, buf, back = arrived.pop(key)
                t0 = time.perf_counter()
                try:
                    work.wait()
                except RuntimeError as exc:
                    raise ExecutionError(f"receiving %{key[0]}{_at(g.node(key[0]))} from GPU {peer_rank[t.src]} "
                                         f"failed on rank {rank}: {_first_line(exc)}") from None
                comm["wait_ms"] += (time.perf_counter() - t0) * 1e3
                comm["collectives"] += 1
                vals[key] = back(buf)
            return ready(key)

        steps = plan.steps()
        with torch.no_grad(), (device if device.type == "cuda" else nullcontext()):
            if not self._linked:
                self._connect(plan, gpus, peer_rank)
                self._linked = True
            share = None
            if plan.replicas > 1:
                sliced = {nid for name, nid in graph.inputs if name in (split or {})}
                share = _Replica(replica, plan.replicas, self._stage_groups[stage], sliced, comm, rank, self.ops.dtype)
            sums: dict[int, list] = {}  # addend node -> [running sum over microbatches, owned here]
            for step in steps:          # the tasks, with their posts and frees made once (RankPlan.steps)
                for peer, upto in step.posts:
                    post(peer, upto)
                args = [value(k) for k in step.reads]
                m = step.mb
                self.ops.memo = memos.setdefault(m, {})
                here = (step.node, m)
                if step.summed is not None:
                    args = [sums[step.summed][0]]   # (a 16-bit sum runs in float32: _task casts it back)
                    if m is None or m == parts - 1:
                        del sums[step.summed]
                vals[here] = self._task(g.node(step.node), m, parts, args, inputs, share,
                                        summed=step.summed is not None)
                if step.into is not None:   # an addend: into the running sum (the first one is kept
                    v = vals[here]          # as it is: it may be a view; the second makes a new,
                    acc = sums.get(step.node)   # contiguous tensor, which collectives need)
                    if acc is None:         # 16-bit addends are summed in float32
                        sums[step.node] = ([v.to(torch.float32, memory_format=torch.contiguous_format), True]
                                           if v.element_size() < 4 and v.is_floating_point() else [v, False])
                    elif acc[1]:
                        acc[0].add_(v)
                    else:
                        total = torch.empty(v.shape, dtype=acc[0].dtype, device=v.device)
                        sums[step.node] = [torch.add(acc[0], v, out=total), True]
                if not self.overlap and isinstance(vals[here], _Later):   # serialised: finish it now
                    ready(here)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                for peer, upto in step.sends:
                    post(peer, upto)
                for key in step.frees:  # a send holds its own reference until it arrives
                    del vals[key]
            # Keyed by the engine graph's output ids (the microbatched graph has its own).
            outs = {orig: value((i, None)) for orig, i in zip(tree_ids(graph.output), outputs)
                    if stage == 0 or (i, None) in vals}
            for peer, seq in plan.pairs.items():     # nothing should be left; post it anyway, in order
                post(peer, len(seq) - 1)
            for key in list(arrived):
                value(key)
            for key, v in list(vals.items()):       # a collective nobody read: finish it anyway
                if isinstance(v, _Later):
                    ready(key)
            t0 = time.perf_counter()
            for work, _buf in sent:
                try:
                    work.wait()
                except RuntimeError as exc:
                    raise ExecutionError(f"a send from rank {rank} failed: {_first_line(exc)}") from None
            comm["wait_ms"] += (time.perf_counter() - t0) * 1e3
        comm["total_ms"] = (time.perf_counter() - t_start) * 1e3
        self.stats = comm
        if self.check and stage == 0:
            bad = [i for i, v in outs.items() if v.dtype.is_floating_point and not bool(torch.isfinite(v).all())]
            if bad:
                raise ExecutionError(f"check failed: output %{bad[0]} holds NaN/Inf; run the engine in one process "
                                     "(`xgrun` without --nproc) to trace its origin op by op")
        return RunOutput(outs, [])

    def _connect(self, plan, gpus: tuple, peer_rank: dict[int, int]) -> None:
        """Make each stage's process group (stages of several GPUs; every rank makes every group,
        in stage order, as torch.distributed requires), then open each pair's link before any
        transfer, every rank visiting its peers in one global order (NCCL builds a pair's
        communicator at its first send or receive and blocks until both ranks are there: ranks
        meeting their peers in different orders would wait on each other)."""
        rank = self.group.rank
        device = torch.device(self.group.device) if self.group.device != "cpu" else None
        self._make_groups(gpus)
        for peer in sorted((peer_rank[k] for k in plan.pairs)):
            token = torch.zeros(1, device=device)
            try:
                if rank < peer:
                    dist.send(token, dst=peer, tag=1 << 30)
                else:
                    dist.recv(token, src=peer, tag=1 << 30)
            except RuntimeError as exc:
                raise ExecutionError(f"rank {rank} could not reach rank {peer}: {_first_line(exc)}") from None

    def _make_groups(self, gpus: tuple) -> None:
        """Stages of several GPUs: one process group per stage, made by every rank in stage order."""
        if len(gpus[0]) < 2:
            return
        try:
            timeout = {} if self.group.timeout_s is None else {"timeout": timedelta(seconds=self.group.timeout_s)}
            self._stage_groups = [dist.new_group(list(ranks), **timeout) for ranks in gpus]
        except RuntimeError as exc:
            raise ExecutionError(f"rank {self.group.rank} could not make the stages' process groups: "
                                 f"{_first_line(exc)}") from None

    def _task(self, n: Node, m: int | None, parts: int, args: list[torch.Tensor],
              inputs: dict[str, torch.Tensor], share: "_Replica | None" = None,
              summed: bool = False) -> torch.Tensor:
        """Node `n` for microbatch `m` (None: once). Combinations act over microbatches
        (ir/microbatch.py): `args` holds every microbatch's piece where the node reads them all
        (or, `summed`, the running sum of a sum's addends); with `share` (one replica of a stage of
        several GPUs), over every replica's too."""
        op = n.op
        if op is Op.STAGE:
            return args[0]
        if share is not None and op in (Op.SHARD, *_MOVES):
            return share.combine(n, m, parts, args, summed)
        if summed:                 # a piece of the running sum, in the node's dtype (16-bit sums ran in float32)
            total = args[0] if op is Op.ALL_REDUCE else args[0].chunk(parts, n.attr("dim"))[m]
            return total.to(self.ops.dtype(n.dtype))
        if op is Op.SHARD:
            return args[0].chunk(parts, n.attr("dim"))[m]
        if op is Op.ALL_GATHER:
            return torch.cat(args, n.attr("dim"))
        if op is Op.ALL_REDUCE:
            return torch.stack(args).sum(0)
        if op is Op.REDUCE_SCATTER:
            return torch.stack(args).sum(0).chunk(parts, n.attr("dim"))[m]
        if op is Op.ALL_TO_ALL:
            return torch.cat(args, n.attr("src")).chunk(parts, n.attr("dim"))[m]
        return self.compute(n, args, inputs)

    def _waiter(self, n: Node, work, finish: Callable[[], torch.Tensor], comm: dict) -> Callable[[], torch.Tensor]:
        """What a consumer of collective `n` calls: wait for the transfer (errors name this rank),
        then the result."""
        def wait() -> torch.Tensor:
            t0 = time.perf_counter()
            try:
                work.wait()
            except RuntimeError as exc:
                raise ExecutionError(f"`{n.op.value}` (node %{n.id}){_at(n)} failed on rank "
                                     f"{self.group.rank}: {_first_line(exc)}") from None
            if not self.overlap and self.group.device != "cpu":
                torch.cuda.synchronize()     # serialised: the transfer ends before any later compute
            comm["wait_ms"] += (time.perf_counter() - t0) * 1e3
            return finish()
        return wait

    def compute(self, n: Node, args: list[torch.Tensor], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        try:
            value = self.ops.eval(n, args, inputs)
        except ExecutionError:
            raise
        except (RuntimeError, IndexError, ValueError, OverflowError) as exc:
            raise ExecutionError(f"`{n.op.value}` (node %{n.id}){_at(n)} failed on rank {self.group.rank}: "
                                 f"{_first_line(exc)}") from None
        want = self.ops.dtype(n.dtype)
        return value if value.dtype == want else value.to(want)

    # --- collectives ----------------------------------------------------------------------------
    def collective(self, n: Node, x, in_place: bool = False,
                   into: torch.Tensor | None = None) -> torch.Tensor | tuple[object, Callable[[], torch.Tensor]]:
        """Start `n`'s collective on `x`: a finished tensor (local slices), or (work, finish).
        `in_place`: `x` is a buffer nothing else reads (an all-reduce may sum into it, no copy).
        `into` (a reduce-scatter): `x` is a list of the world's pieces, in rank order, and their sum's
        piece for this rank goes into `into`."""
        world, rank = self.group.world, self.group.rank
        if into is not None:
            if world == 1:
                into.copy_(x[0])
                return into
            return dist.reduce_scatter(into, [c.contiguous() for c in x], async_op=True), lambda: into
        if world == 1 and n.op is not Op.SHARD:
            return x
        if n.op is Op.SHARD:
            return x.chunk(world, n.attr("dim"))[rank]
        wire, back = _wire(x)
        if n.op is Op.ALL_REDUCE:
            keep = in_place and wire is x and x.is_contiguous()
            buf = wire if keep else wire.clone(memory_format=torch.contiguous_format)   # (a strided view: copied)
            return dist.all_reduce(buf, async_op=True), lambda: back(buf)
        if n.op is Op.ALL_GATHER:
            parts = [torch.empty_like(wire) for _ in range(world)]
            work = dist.all_gather(parts, wire.contiguous(), async_op=True)
            return work, lambda: back(torch.cat(parts, n.attr("dim")))
        if n.op is Op.REDUCE_SCATTER:
            chunks = [c.contiguous() for c in wire.chunk(world, n.attr("dim"))]
            out = torch.empty_like(chunks[rank])
            return dist.reduce_scatter(out, chunks, async_op=True), lambda: back(out)
        # ALL_TO_ALL: send chunk r of my piece (split along the new dim) to rank r; join what
        # arrives along the old dim, in rank order.
        send = [c.contiguous() for c in wire.chunk(world, n.attr("dim"))]
        recv = [torch.empty_like(c) for c in send]
        work = dist.all_to_all(recv, send, async_op=True)
        return work, lambda: back(torch.cat(recv, n.attr("src")))


_MOVES = (Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL)


class _Later:
    """A value a collective is still making: `get()` waits for it (once) and returns it."""

    def __init__(self, finish: Callable[[], torch.Tensor]) -> None:
        self.finish, self.value = finish, None

    def get(self) -> torch.Tensor:
        if self.value is None:
            self.value = self.finish()
        return self.value


class _Replica:
    """One replica's share of a stage of several GPUs: it holds microbatches d*M to d*M + M - 1 of
    the M * D pieces (ir/microbatch.py), so a combination over microbatches combines its own pieces,
    then the replicas' with a collective in the stage's group (every replica of the stage runs the
    same tasks in the same order, so their collectives meet). A collective is started at once and
    waited for where a task first reads its result (`_Later`), so the compute in between overlaps
    it (with NCCL it runs on NCCL's stream)."""

    def __init__(self, index: int, count: int, group, sliced: set[int], comm: dict, rank: int,
                 dtype: Callable[[str], torch.dtype]) -> None:
        self.index, self.count, self.group, self.sliced, self.comm, self.rank = index, count, group, sliced, comm, rank
        self.dtype = dtype                      # an IR dtype's torch dtype on this rank (float64 mode)
        self.whole: dict[int, _Later] = {}      # a combination read by every microbatch: made once

    def combine(self, n: Node, m: int | None, parts: int, args: list[torch.Tensor],
                summed: bool = False) -> torch.Tensor | _Later:
        """`summed`: `args` is the running sum of this replica's addends (a new tensor, reduced in
        place), not the addends themselves."""
        op, dim = n.op, n.attr("dim")
        want = self.dtype(n.dtype)
        local_sum = (lambda: args[0].to(want)) if summed else (lambda: torch.stack(args).sum(0))
        piece = self.index * parts + (m or 0)
        if op is Op.SHARD:          # this replica's microbatch m of a whole value (or of its loaded share)
            if n.inputs[0] in self.sliced:
                return args[0].chunk(parts, dim)[m]
            return args[0].chunk(parts * self.count, dim)[piece]
        if op is Op.ALL_GATHER:
            return self._gather(torch.cat(args, dim), dim, n)
        if op is Op.ALL_REDUCE:
            return self._sum(local_sum(), n)
        if n.id not in self.whole:  # reduce_scatter / all_to_all: the whole value, then piece m
            self.whole[n.id] = (self._sum(local_sum(), n) if op is Op.REDUCE_SCATTER
                                else self._gather(torch.cat(args, n.attr("src")), n.attr("src"), n))
        whole = self.whole[n.id]
        if m == parts - 1:
            del self.whole[n.id]
        return _Later(lambda: whole.get().chunk(parts * self.count, dim)[piece])

    def _sum(self, x: torch.Tensor, n: Node) -> _Later:
        wire, back = _wire(x)                 # x is made here (a sum): reduced in place
        wire = wire.contiguous()              # NCCL takes contiguous tensors only
        return self._start(n, lambda: dist.all_reduce(wire, group=self.group, async_op=True), lambda: back(wire))

    def _gather(self, x: torch.Tensor, dim: int, n: Node) -> _Later:
        wire, back = _wire(x.contiguous())
        parts = [torch.empty_like(wire) for _ in range(self.count)]
        return self._start(n, lambda: dist.all_gather(parts, wire, group=self.group, async_op=True),
                           lambda: back(torch.cat(parts, dim)))

    def _start(self, n: Node, call: Callable[[], object], finish: Callable[[], torch.Tensor]) -> _Later:
        def failed(exc: RuntimeError) -> ExecutionError:
            return ExecutionError(f"`{n.op.value}` (node %{n.id}){_at(n)} across the stage's GPUs failed on rank "
                                  f"{self.rank}: {_first_line(exc)}")
        t0 = time.perf_counter()
        try:
            work = call()
        except (RuntimeError, ValueError) as exc:      # NCCL refuses some tensors with ValueError
            raise failed(exc) from None
        self.comm["collectives"] += 1
        self.comm["issue_ms"] += (time.perf_counter() - t0) * 1e3

        def wait() -> torch.Tensor:
            t1 = time.perf_counter()
            try:
                work.wait()
            except RuntimeError as exc:
                raise failed(exc) from None
            self.comm["wait_ms"] += (time.perf_counter() - t1) * 1e3
            return finish()
        return _Later(wait)


def _comm_early(graph: Graph) -> list[Node]:
    """The nodes in an order that starts each collective right after its input is computed (the
    pass places it just before its first consumer), so the compute in between overlaps it. Every
    rank derives the same order, so collectives are issued in the same sequence everywhere."""
    waiting: dict[int, list[Node]] = {}
    for n in graph.nodes:
        if n.op in _MOVES:
            waiting.setdefault(n.inputs[0], []).append(n)
    order: list[Node] = []
    for n in graph.nodes:
        if n.op in _MOVES:
            continue
        ready = [n]
        while ready:                 # a collective of a collective follows it at once too
            m = ready.pop(0)
            order.append(m)
            ready.extend(waiting.pop(m.id, ()))
    return order


def _wire(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """Backends move numbers, not booleans: send bools as uint8 and turn them back."""
    if x.dtype is torch.bool:
        return x.to(torch.uint8), lambda t: t.to(torch.bool)
    return x, lambda t: t


def _at(n: Node) -> str:
    return f" at {src_text(n.src)}" if n.src else ""


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
