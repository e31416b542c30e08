"""A captured CUDA graph pointed at each run's own inputs and outputs: no copies in or out.

A capture reads its inputs from buffers of its own and leaves its outputs in its memory pool; by
itself, each replay would copy every input in and clone every output out (a 4096 x 4096 GEMM's
copies cost a quarter of its time; a training step's state, 2.6 ms of 46). Instead, the launcher
records every launch of the capture (function, grid, argument block), and `Binder` finds the
graph node each one became. Before a replay, the nodes whose arguments point into an input buffer
are given the caller's tensor (`cuGraphExecKernelNodeSetParams`; only when its address changed),
and those that write an output are given a fresh tensor from torch's allocator, which the caller
then owns. A buffer that a PyTorch operator reads or writes during the capture (a copy making an
input contiguous, a fallback operator, an output that is a view of a constant) is left as it was:
it is copied in or cloned out, as before. When anything here fails, the capture is used the old
way (`Binder.build` returns the reason instead).
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .cuda import CudaRuntimeError, check_call, driver_module

_ALLOCATIONS = {"empty", "empty_strided", "empty_like", "set_"}           # no data read or written
_VIEWS = {"_unsafe_view", "alias", "detach", "lift_fresh", "as_strided"}  # views `is_view` misses


class TorchTouches(TorchDispatchMode):
    """The storages (by address) that PyTorch operators read or write while active: views and
    allocations aside, every tensor an operator takes or returns."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not func.is_view and name not in _ALLOCATIONS and name not in _VIEWS:
            for t in tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                    self.storages.add(t.untyped_storage().data_ptr())
        return out


@dataclass
class _Site:
    """One kernel node whose arguments point into rebound buffers."""
    node: Any
    params: Any                          # its CUDA_KERNEL_NODE_PARAMS, kernelParams -> `pointers`
    block: ctypes.Array                  # its argument block (`KernelBinary.layout`)
    pointers: ctypes.Array
    slots: list[tuple[int, Any, int]]    # (byte offset in the block, buffer key, offset into the buffer)


class Binder:
    """The kernel nodes of one instantiated graph that read or write rebound buffers (see the module)."""

    def __init__(self, exec_handle: Any, sites: list[_Site], current: dict[Any, int], enter, leave) -> None:
        self._exec = exec_handle
        self._sites = sites
        self._by_key: dict[Any, list[_Site]] = {}
        for s in sites:
            for _off, key, _delta in s.slots:
                if s not in self._by_key.setdefault(key, []):
                    self._by_key[key].append(s)
        self.current = current           # buffer key -> the address its nodes point at now
        self._enter, self._leave = enter, leave
        self._drv = driver_module()
        self.keys = frozenset(self._by_key)     # the buffers some node reads or writes
        self.inputs = tuple(key[1] for key in self._by_key if key[0] == "in")   # their input names

    @classmethod
    def build(cls, cuda_graph: Any, launches: list[tuple], buffers: dict[Any, tuple[int, int]],
              enter, leave) -> "Binder | str":
        """`launches`: the capture's (KernelBinary, CUfunction, grid, argument block) in launch
        order; `buffers`: key -> (address, bytes, first launch) of each buffer to rebind: launches
        before its first one that point into its addresses meant memory that lived there before
        it. A Binder, or why none."""
        drv = driver_module()
        pushed = enter()
        try:
            nodes = _chain(drv, drv.CUgraph(cuda_graph.raw_cuda_graph()))
            if isinstance(nodes, str):
                return nodes
            kernel = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
            kernels = [(n, check_call(drv.cuGraphKernelNodeGetParams(n), "cuGraphKernelNodeGetParams"))
                       for n in nodes if check_call(drv.cuGraphNodeGetType(n), "cuGraphNodeGetType") == kernel]
            sites, at = [], 0
            for (k, func, grid, data), slots in zip(launches, pointer_slots(launches, buffers)):
                while at < len(kernels) and int(kernels[at][1].func) != func:
                    at += 1
                if at == len(kernels):
                    return f"no graph node for a launch of `{k.name}`"
                node, params = kernels[at]
                at += 1
                if (params.gridDimX, params.gridDimY, params.gridDimZ) != tuple(grid):
                    return f"the graph node of `{k.name}` has another grid"
                if not slots:
                    continue
                block = ctypes.create_string_buffer(data, len(data))
                pointers = (ctypes.c_void_p * (len(data) // 8))(*[ctypes.addressof(block) + 8 * j
                                                                  for j in range(len(data) // 8)])
                params.kernelParams = ctypes.addressof(pointers)
                sites.append(_Site(node, params, block, pointers, slots))
            exec_handle = drv.CUgraphExec(cuda_graph.raw_cuda_graph_exec())
        except (CudaRuntimeError, RuntimeError, AttributeError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            leave(pushed)
        return cls(exec_handle, sites, {key: addr for key, (addr, _size, _first) in buffers.items()}, enter, leave)

    def bind(self, addresses: dict[Any, int]) -> None:
        """Point the graph's nodes at `addresses` (buffer key -> address), where they moved."""
        moved = [key for key, addr in addresses.items() if self.current.get(key) != addr]
        if not moved:
            return
        sites: list[_Site] = []
        for key in moved:
            for s in self._by_key.get(key, ()):
                if s not in sites:
                    sites.append(s)
        self.current.update(addresses)
        drv = self._drv
        pushed = self._enter()
        try:
            for s in sites:
                for off, key, delta in s.slots:
                    struct.pack_into("<Q", s.block, off, self.current[key] + delta)
                check_call(drv.cuGraphExecKernelNodeSetParams(self._exec, s.node, s.params),
                           "cuGraphExecKernelNodeSetParams")
        except CudaRuntimeError:
            self.current = {}            # unknown: every node is set again next time
            raise
        finally:
            self._leave(pushed)


def pointer_slots(launches: list[tuple], buffers: dict[Any, tuple[int, int, int]]) -> list[list[tuple[int, Any, int]]]:
    """Per launch (`Binder.build`'s), the pointer arguments that point into a buffer to rebind:
    (byte offset in its argument block, buffer key, offset into the buffer). A launch before a
    buffer's first one (its allocation) that points into its addresses meant other memory."""
    spans = sorted((addr, addr + size, key, first) for key, (addr, size, first) in buffers.items() if size)
    out = []
    for index, (k, _func, _grid, data) in enumerate(launches):
        slots = []
        for i, _pointee in k.pointer_dtypes:
            ptr = struct.unpack_from("<Q", data, 8 * i)[0]
            for lo, hi, key, first in spans:
                if lo <= ptr < hi and index >= first:
                    slots.append((8 * i, key, ptr - lo))
                    break
        out.append(slots)
    return out


def plan_buffers(inputs: dict[str, torch.Tensor], copied: tuple[str, ...], outputs: dict[int, torch.Tensor],
                 touched: set[int], births: dict[int, int]) -> tuple[dict, dict]:
    """Which of a capture's buffers each replay re-points (see the module docstring): (key ->
    (address, bytes, first launch), output id -> [key, bytes, dtype, shape, stride, offset, whole]).
    `inputs`: the tensors the capture read (its own copies for `copied`); `outputs`: its output
    buffers; `touched`: storages PyTorch operators touched in it; `births`: storage address ->
    launches made before its allocation. An input stays copied when an operator touched it or an
    output is (a view of) it; an output keeps being cloned when an operator touched it, it is an
    input's, or no kernel of the capture allocated it. `whole`: the output is its buffer (allocated
    as itself, not as bytes), and no other output shares it."""
    buffers: dict = {}
    aliased = {t.untyped_storage().data_ptr() for t in outputs.values()}
    for n in copied:
        t = inputs[n]
        base = t.untyped_storage().data_ptr()
        if base not in touched and base not in aliased and t.is_contiguous():
            buffers[("in", n)] = (t.data_ptr(), t.untyped_storage().nbytes() - t.storage_offset() * t.element_size(), 0)
    held = {t.untyped_storage().data_ptr() for t in inputs.values()}
    fresh: dict = {}
    for nid, t in outputs.items():
        base = t.untyped_storage().data_ptr()
        if base in touched or base in held or base not in births:
            continue
        key = ("out", base)
        nbytes = t.untyped_storage().nbytes()
        buffers[key] = (base, nbytes, births[base])
        fresh[nid] = [key, nbytes, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                      t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == nbytes]
    shared = [f[0] for f in fresh.values()]
    for f in fresh.values():
        f[6] = f[6] and shared.count(f[0]) == 1
    return buffers, fresh


def _listing(call, handle) -> list:
    """A cuda-python `(err, items, [edge data,] count)` listing: asked for its size, then for all."""
    first = call(handle, 0)
    check_call(first[:1] + (None,), call.__name__)
    count = int(first[-1])
    if not count:
        return []
    return list(check_call(call(handle, count)[:2], call.__name__))[:count]


def _chain(drv, graph) -> list | str:
    """The graph's nodes in the order they were captured: one stream's capture is a chain, each
    node depending on the one before. The reason it is not, otherwise."""
    roots = _listing(drv.cuGraphGetRootNodes, graph)
    total = len(_listing(drv.cuGraphGetNodes, graph))
    if len(roots) != 1:
        return f"the capture has {len(roots)} root nodes, not one chain"
    order = [roots[0]]
    while True:
        after = _listing(drv.cuGraphNodeGetDependentNodes, order[-1])
        if not after:
            break
        if len(after) != 1:
            return "the capture is not one chain of nodes"
        order.append(after[0])
        if len(order) > total:
            return "the capture's nodes form a cycle"
    if len(order) != total:
        return f"the chain reaches {len(order)} of the capture's {total} nodes"
    return order
