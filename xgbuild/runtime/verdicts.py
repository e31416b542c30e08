"""Check mode's verdict on a GPU run, read without stopping the GPU.

A checked run leaves its evidence on the device: the flag word its kernels raise on a NaN or Inf,
whether each output no kernel guards is finite, the [min, max] of every index the program computes
and of every index input. `Pending` queues one copy of that evidence behind the run into a slot
of pinned host memory (`Mailbox`: a lone flag word needs no event, its slot reads -1 until the copy
lands); nothing waits. The verdict is read when the host next has to know: the caller reads the
result (`RunResult.value`), the engine runs again (the runs that finished by then),
`Engine.synchronize()`, a run asked to wait, or the interpreter's exit (a failure then is printed).
A run that failed raises there, naming the run, as a CUDA error surfaces in PyTorch; the GPU never
idles for a check in between.

On a NaN or Inf the program runs again on the CPU reference, op by op, which names the op that
made the first one and its source line, from the run's own inputs while the caller still holds
them (weak references: a check never keeps a run's tensors alive); otherwise the message names
the kernels that stored the bad values.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import sys
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..compiler.ir.graph import Graph, Node
from ..compiler.ir.serialize import where as src_text
from ..errors import ExecutionError, InputError
from .cpu import CpuExecutor

MAX_PENDING = 64          # checks in flight per executor before a new run waits for the oldest
_RUNS = itertools.count(1)


@dataclass
class Evidence:
    """What a run left on the device for its check, before it is queued to the host."""
    flags: torch.Tensor | None = None                  # the kernels' NaN/Inf word (int32 [1])
    unguarded: list[tuple[int, torch.Tensor]] = field(default_factory=list)   # outputs no flag covers
    gathers: tuple[list[tuple[Node, int]], torch.Tensor | None] = ([], None)  # computed indices: (node, rows), [k, 2]
    ranges: list[tuple[str, int, int, torch.Tensor]] = field(default_factory=list)   # index inputs: name, lo, hi, [2]
    stored_by: str | Callable[[], str] = ""            # the kernels that store the guarded outputs (messages)


class Mailbox:
    """Pinned host slots the evidence is copied into, each with its event: through the CUDA driver,
    a few microseconds a run (a pinned tensor, a torch Event and `copy_` cost ten times that).
    `enter`/`leave` make the launcher's context current (`KernelLauncher._enter`/`_exit`)."""

    SLOT = 2048                 # bytes: a flag word and 255 [min, max] pairs of int64

    def __init__(self, enter: Callable[[], bool], leave: Callable[[bool], None], slots: int = MAX_PENDING + 8,
                 driver: Any = None) -> None:
        """`driver`: cuda-python's driver module (the default), or a stand-in with its calls."""
        from .cuda import check_call, driver_module
        self._drv, self._check = drv, check = driver or driver_module(), check_call
        pushed = enter()
        try:
            self.base = int(check(drv.cuMemHostAlloc(self.SLOT * slots, 0), "cuMemHostAlloc"))
            flag = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
            self.events = [check(drv.cuEventCreate(flag), "cuEventCreate") for _ in range(slots)]
        finally:
            leave(pushed)
        self.free = list(range(slots))
        self._not_ready = drv.CUresult.CUDA_ERROR_NOT_READY
        self._ok = drv.CUresult.CUDA_SUCCESS
        self._memcpy = drv.cuMemcpyDtoHAsync
        self._words = (ctypes.c_int32 * (slots * self.SLOT // 4)).from_address(self.base)
        self._streams = [0] * slots
        self._single = [False] * slots

    def post(self, dev: torch.Tensor, stream: int) -> int | None:
        """Queue `dev` (contiguous) to a free slot behind the work on `stream`; None when no slot
        is free or it does not fit. A lone flag word (the usual evidence: a non-negative bit mask)
        needs no event: its slot holds -1 until the copy lands, and the host reads it there."""
        nbytes = dev.numel() * dev.element_size()
        if nbytes == 4:
            return self.post_word(dev.data_ptr(), stream)
        if nbytes > self.SLOT or not self.free:
            return None
        slot = self.free.pop()
        drv, check = self._drv, self._check
        single = self._single[slot] = nbytes == 4
        if single:
            self._words[slot * self.SLOT // 4] = -1
        self._streams[slot] = stream
        check(drv.cuMemcpyDtoHAsync(self.base + slot * self.SLOT, dev.data_ptr(), nbytes, stream), "cuMemcpyDtoHAsync")
        if not single:
            check(drv.cuEventRecord(self.events[slot], stream), "cuEventRecord")
        return slot

    def post_word(self, ptr: int, stream: int) -> int | None:
        """`post` of the one int32 word at device address `ptr` (a run's flag word): the path every
        checked run takes, kept to the driver call (a few microseconds of host time a run)."""
        free = self.free
        if not free:
            return None
        slot = free.pop()
        self._single[slot] = True
        self._words[slot * self.SLOT // 4] = -1
        self._streams[slot] = stream
        err = self._memcpy(self.base + slot * self.SLOT, ptr, 4, stream)[0]
        if err != self._ok:
            free.append(slot)
            self._check((err,), "cuMemcpyDtoHAsync")
        return slot

    def ready(self, slot: int) -> bool:
        if self._single[slot]:
            return self._words[slot * self.SLOT // 4] != -1
        err = self._drv.cuEventQuery(self.events[slot])[0]
        if err == self._not_ready:
            return False
        self._check((err,), "cuEventQuery")
        return True

    def take(self, slot: int, count: int, wide: bool) -> list[int]:
        """Wait for `slot`, read its `count` integers (int64 if `wide`, else int32) and free it."""
        if not self._single[slot]:
            self._check(self._drv.cuEventSynchronize(self.events[slot]), "cuEventSynchronize")
        else:
            at = slot * self.SLOT // 4
            if self._words[at] == -1:      # not landed yet: wait for its stream (errors raise)
                self._check(self._drv.cuStreamSynchronize(self._streams[slot]), "cuStreamSynchronize")
            if count == 1 and not wide:
                value = self._words[at]
                self.free.append(slot)
                return [value]
        kind = ctypes.c_int64 if wide else ctypes.c_int32
        values = list((kind * count).from_address(self.base + slot * self.SLOT))
        self.free.append(slot)
        return values


class Pending:
    """One checked run's evidence on its way to the host (see the module docstring)."""

    def __init__(self, graph: Graph, inputs: dict[str, torch.Tensor], evidence: Evidence,
                 mailbox: Mailbox | None = None, stream: int = 0, kept: dict[str, torch.Tensor] | None = None) -> None:
        """`kept`: inputs that live as long as the engine (its weights): held, not weakly referenced."""
        self.run = next(_RUNS)
        self.graph = graph
        self.evidence = evidence
        self.settled = False
        self._kept = kept or {}
        self._inputs = _weak({n: t for n, t in inputs.items() if n not in self._kept} if kept else inputs)
        self.host: torch.Tensor | None = None
        self.event = None
        self.values: list[int] = []          # the evidence on the host, once read
        self._mailbox, self._slot = mailbox, None
        parts = []
        if evidence.flags is not None:
            flags = evidence.flags
            parts.append(flags if flags.dim() == 1 else flags.reshape(-1))
        if evidence.unguarded:
            ends = torch.stack([torch.stack(torch.aminmax(v)).float() for _, v in evidence.unguarded])
            parts.append((~torch.isfinite(ends).all(dim=1)).to(torch.int32))
        if evidence.gathers[1] is not None:
            parts.append(evidence.gathers[1].reshape(-1))
        parts += [r[3].reshape(-1) for r in evidence.ranges]
        if parts:
            dtype = torch.int32 if all(p.dtype == torch.int32 for p in parts) else torch.int64
            dev = parts[0] if len(parts) == 1 and parts[0].dtype == dtype else torch.cat([p.to(dtype) for p in parts])
            if dev.is_cuda and mailbox is not None:
                self._slot = mailbox.post(dev, stream)
                self._count, self._wide = dev.numel(), dtype == torch.int64
            if self._slot is not None:
                pass
            elif dev.is_cuda:
                self.host = torch.empty(dev.shape, dtype=dtype, pin_memory=True)
                self.host.copy_(dev, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
            else:                           # (host tensors: the evidence is here already)
                self.values = dev.tolist()

    def ready(self) -> bool:
        if self._slot is not None:
            return self._mailbox.ready(self._slot)
        return self.event is None or self.event.query()

    def settle(self, later: bool) -> None:
        """Wait for the evidence and raise the run's error, if any (once). `later`: the caller is
        told after the call that queued the run returned, so the message says which run it was."""
        if self.settled:
            return
        self.settled = True
        if self._slot is not None:
            slot, self._slot = self._slot, None
            self.values = self._mailbox.take(slot, self._count, self._wide)
        if self.event is not None:
            self.event.synchronize()
        if self.host is not None:
            self.values = self.host.tolist()
        self.host = self.event = None
        try:
            self._verdict(self.values)
        except (InputError, ExecutionError) as exc:
            if not later:
                raise
            raise type(exc)(f"run #{self.run} of this engine, queued earlier (checks are read asynchronously): "
                            f"{exc}") from None

    def _verdict(self, values: list[int]) -> None:
        ev = self.evidence
        at = 0
        raised = False
        if ev.flags is not None:
            raised, at = bool(values[0]), 1
        bad = [nid for (nid, _), hit in zip(ev.unguarded, values[at:at + len(ev.unguarded)]) if hit]
        at += len(ev.unguarded)
        bounds = values[at:at + 2 * len(ev.gathers[0])]
        at += len(bounds)
        for k, (name, lo, hi, _mm) in enumerate(ev.ranges):     # the caller's bad input is the cause to name first
            input_in_range(name, lo, hi, values[at + 2 * k], values[at + 2 * k + 1])
        for k, (n, rows) in enumerate(ev.gathers[0]):
            index_in_bounds(n, rows, bounds[2 * k], bounds[2 * k + 1])
        if not raised and not bad:
            return
        inputs = self._alive()
        if inputs is not None:
            try:
                CpuExecutor(check=True, timings=False).run(self.graph, {k: v.cpu() for k, v in inputs.items()})
            except ExecutionError as exc:
                raise ExecutionError(f"{exc} (seen on the GPU's kernels, traced on the CPU reference)") from None
            where = f" (node %{bad[0]})" if bad else ""
            raise ExecutionError(f"check failed: an output holds NaN/Inf in the kernels' result{where} but not on "
                                 "the CPU reference: the kernels' result is wrong")
        what = f"output %{bad[0]}" if bad else "an output"
        by = ev.stored_by() if callable(ev.stored_by) else ev.stored_by
        raise ExecutionError(f"check failed: {what} holds NaN/Inf in the kernels' result (stored by "
                             f"{by or 'no kernel'}); its inputs are gone, so the op that made it is not "
                             "traced: run it again with wait=True to have it named")

    def _alive(self) -> dict[str, torch.Tensor] | None:
        out = dict(self._kept)
        for name, ref in self._inputs.items():
            t = ref()
            if t is None:
                return None
            out[name] = t
        return out


def input_in_range(name: str, lo: int, hi: int, tmin: int, tmax: int) -> None:
    """An InputError when index input `name`, whose values span [tmin, tmax], leaves [lo, hi)."""
    if tmin < lo or tmax >= hi:
        raise InputError(f"input `{name}` holds {tmin if tmin < lo else tmax}, outside [{lo}, {hi}): it indexes a "
                         f"table of {hi} rows")


def index_in_bounds(n: Node, rows: int, lo: int, hi: int) -> None:
    """An ExecutionError when the indices GATHER `n` computed, spanning [lo, hi], leave its table of `rows`."""
    if lo < 0 or hi >= rows:
        line = f" at {src_text(n.src)}" if n.src else ""
        raise ExecutionError(f"index {lo if lo < 0 else hi} is out of bounds for a table of {rows} rows{line} "
                             "(computed by the program; on the GPU the lookup read zeros)")


def _weak(inputs: dict[str, torch.Tensor]) -> dict[str, Callable[[], torch.Tensor | None]]:
    out: dict[str, Callable[[], Any]] = {}
    for name, t in inputs.items():
        try:
            out[name] = weakref.ref(t)
        except TypeError:           # (a tensor subclass without weak references: never traced)
            out[name] = lambda: None
    return out


class Verdicts:
    """An executor's checks in flight, oldest first. Those still unread when the interpreter
    exits are read then, and a failure among them is printed (`_report_at_exit`): a script whose
    last call went wrong is told so."""

    def __init__(self) -> None:
        self._queue: deque[Pending] = deque()
        self._runs = 0
        _LIVE.add(self)

    def add(self, pending: Pending) -> None:
        """Queue `pending`, numbered among this executor's checked runs (the number its error gives)."""
        self._runs += 1
        pending.run = self._runs
        self._queue.append(pending)

    def __len__(self) -> int:
        return len(self._queue)

    def settle_ready(self) -> None:
        """Read the checks of the runs that have finished (no wait), oldest first, raising the first
        failure; while more than MAX_PENDING are in flight, wait for the oldest. Each failed run is
        reported once, in the order the runs were queued."""
        while self._queue and (len(self._queue) > MAX_PENDING or self._queue[0].ready()):
            self._queue.popleft().settle(later=True)

    def settle_through(self, last: Pending | None, later: bool) -> None:
        """Wait for every check up to `last` (all, when None), oldest first, raising the first
        failure; `later` as `Pending.settle` says, for `last` itself."""
        while self._queue and not (last is not None and last.settled):
            p = self._queue.popleft()
            p.settle(later=later or p is not last)
        if last is not None:
            last.settle(later=later)


_LIVE: "weakref.WeakSet[Verdicts]" = weakref.WeakSet()


@atexit.register
def _report_at_exit() -> None:
    for verdicts in list(_LIVE):
        while True:
            try:
                verdicts.settle_through(None, later=True)
                break
            except (InputError, ExecutionError) as exc:
                print(f"xg: a queued GPU run's check failed and nothing read it before exit: {exc}", file=sys.stderr)
            except Exception:  # noqa: BLE001 (the GPU may be gone this late: nothing left to tell)
                break
