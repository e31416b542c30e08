"""GPU memory without torch: the deploy runtime's device, its allocations and strided views.

`CudaDevice` holds one GPU's primary context (the one every CUDA runtime on the host shares, so
pointers from torch or CuPy are valid in it), a stream, and the driver's stream-ordered memory
pool (`cuMemAllocAsync`, kept warm: a second run of an engine reuses the first run's memory).
`DeviceArray` is a strided view of an allocation with the part of torch.Tensor's interface that
the launch ABI (`compiler/codegen/launch.py`) and the kernel templates use to line operands up
with a kernel's domain: shape, stride(), reshape, expand, permute, indexing... Views never copy;
a reshape that cannot be a view copies, as torch's does, through the driver's 2-D copies.

Nothing here imports torch, Triton or numpy at module level, and `cuda.bindings` loads on first use.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..dtypes import FLOAT_DTYPES, ITEMSIZE
from ..compiler.ir.strides import contiguous_strides, view_strides
from .cuda import CudaRuntimeError, check_call, driver_module

MAX_COPY_CALLS = 1 << 12        # a strided copy made of more launches than this is refused


@dataclass(frozen=True)
class DeviceRef:
    """What `tensor.device` answers for a DeviceArray: `.type` and `.index`, as torch's does."""
    type: str
    index: int

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


class DType(str):
    """An XG dtype name with torch's `is_floating_point` and `itemsize` (what the launch ABI reads)."""

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self]

    @property
    def is_floating_point(self) -> bool:
        return self in FLOAT_DTYPES


class Allocation:
    """One block of device memory, freed (stream-ordered) when the last view of it goes."""
    __slots__ = ("device", "ptr", "nbytes", "__weakref__")

    def __init__(self, device: "CudaDevice", ptr: int, nbytes: int) -> None:
        self.device, self.ptr, self.nbytes = device, ptr, nbytes

    def __del__(self) -> None:
        if self.ptr:
            try:
                self.device.free(self.ptr)
            except Exception:  # noqa: BLE001 (interpreter shutdown: the context goes with the process)
                pass
            self.ptr = 0


class DeviceArray:
    """A strided view of device memory: `shape`, `stride()` and `dtype` (an XG name) over an
    `Allocation` (or foreign memory: `owner` keeps whatever holds it alive)."""
    __slots__ = ("owner", "ptr", "shape", "_strides", "dtype", "device_ref")

    def __init__(self, owner: Any, ptr: int, shape: Sequence[int], strides: Sequence[int], dtype: str,
                 device_ref: DeviceRef) -> None:
        self.owner, self.ptr = owner, ptr
        self.shape = tuple(int(s) for s in shape)
        self._strides = tuple(int(s) for s in strides)
        self.dtype = DType(dtype)
        self.device_ref = device_ref

    # --- torch.Tensor's vocabulary, as the launch ABI uses it ----------------------------------
    @property
    def device(self) -> DeviceRef:
        return self.device_ref

    @property
    def is_cuda(self) -> bool:
        return True

    def get_device(self) -> int:
        return self.device_ref.index

    def data_ptr(self) -> int:
        return self.ptr

    def stride(self, dim: int | None = None) -> Any:
        return self._strides if dim is None else self._strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel() * self.itemsize

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def is_contiguous(self) -> bool:
        return _dense_ignoring_ones(self.shape, self._strides)

    def _view(self, shape: Sequence[int], strides: Sequence[int], offset: int = 0) -> "DeviceArray":
        return DeviceArray(self.owner, self.ptr + offset * self.itemsize, shape, strides, self.dtype, self.device_ref)

    def reshape(self, *shape: Any) -> "DeviceArray":
        new = _infer(self.shape, _shape_arg(shape))
        strides = view_strides(self.shape, self._strides, new)
        if strides is None:             # as torch: a copy where no view has these dims
            return self.contiguous().reshape(new)
        return self._view(new, strides)

    view = reshape

    def expand(self, *shape: Any) -> "DeviceArray":
        shape = _shape_arg(shape)
        lead = len(shape) - self.dim()
        if lead < 0:
            raise ValueError(f"cannot expand {list(self.shape)} to fewer dims {list(shape)}")
        sizes, strides = [], []
        for d, want in enumerate(shape):
            if d < lead:
                if want < 0:
                    raise ValueError(f"-1 is not allowed for the new leading dim {d}")
                sizes.append(want)
                strides.append(0)
                continue
            have, stride = self.shape[d - lead], self._strides[d - lead]
            if want == -1 or want == have:
                sizes.append(have)
                strides.append(stride)
            elif have == 1:
                sizes.append(want)
                strides.append(0)
            else:
                raise ValueError(f"cannot expand {list(self.shape)} to {list(shape)}: dim {d}")
        return self._view(sizes, strides)

    def permute(self, *dims: Any) -> "DeviceArray":
        dims = [d % max(self.dim(), 1) for d in _shape_arg(dims)]
        if sorted(dims) != list(range(self.dim())):
            raise ValueError(f"permute({dims}) of a {self.dim()}-d array")
        return self._view([self.shape[d] for d in dims], [self._strides[d] for d in dims])

    def transpose(self, dim0: int, dim1: int) -> "DeviceArray":
        order = list(range(self.dim()))
        a, b = dim0 % self.dim(), dim1 % self.dim()
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def unsqueeze(self, dim: int) -> "DeviceArray":
        d = dim % (self.dim() + 1)
        inner = self._strides[d] * self.shape[d] if d < self.dim() else 1
        return self._view(self.shape[:d] + (1,) + self.shape[d:], self._strides[:d] + (inner,) + self._strides[d:])

    def squeeze(self, dim: int) -> "DeviceArray":
        d = dim % self.dim()
        if self.shape[d] != 1:
            return self
        return self._view(self.shape[:d] + self.shape[d + 1:], self._strides[:d] + self._strides[d + 1:])

    def select(self, dim: int, index: int) -> "DeviceArray":
        d = dim % self.dim()
        i = index + self.shape[d] if index < 0 else index
        if not 0 <= i < self.shape[d]:
            raise IndexError(f"index {index} is out of bounds for dim {d} of size {self.shape[d]}")
        return self._view(self.shape[:d] + self.shape[d + 1:], self._strides[:d] + self._strides[d + 1:],
                          i * self._strides[d])

    def __getitem__(self, key: Any) -> "DeviceArray":
        items = list(key) if isinstance(key, tuple) else [key]
        used = sum(1 for k in items if k is not None and k is not Ellipsis)
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at:at + 1] = [slice(None)] * (self.dim() - used)
        items += [slice(None)] * (self.dim() - sum(1 for k in items if k is not None))
        shape, strides, offset, d = [], [], 0, 0
        for k in items:
            if k is None:                       # a new dim of 1, strided as torch's (an unsqueeze before
                shape.append(1)                 # the items after it apply)
                strides.append(self.shape[d] * self._strides[d] if d < self.dim() else 1)
                continue
            size, stride = self.shape[d], self._strides[d]
            if isinstance(k, slice):
                r = range(size)[k]
                if r.step <= 0:
                    raise ValueError("a DeviceArray has no negative strides")
                offset += r.start * stride
                shape.append(len(r))
                strides.append(stride * r.step)
            else:
                i = int(k) + size if int(k) < 0 else int(k)
                if not 0 <= i < size:
                    raise IndexError(f"index {k} is out of bounds for dim {d} of size {size}")
                offset += i * stride
            d += 1
        return self._view(shape, strides, offset)

    def contiguous(self) -> "DeviceArray":
        if self.is_contiguous():
            return self
        out = self.device_obj.empty(self.shape, self.dtype)
        self.device_obj.copy_strided(out, self)
        return out

    def clone(self) -> "DeviceArray":
        out = self.device_obj.empty(self.shape, self.dtype)
        if self.is_contiguous():
            self.device_obj.copy_dense(out, self)
        else:
            self.device_obj.copy_strided(out, self)
        return out

    @property
    def device_obj(self) -> "CudaDevice":
        owner = self.owner
        if isinstance(owner, Allocation):
            return owner.device
        return CudaDevice.get(self.device_ref.index)

    def numpy(self) -> Any:
        """A host copy (numpy; bfloat16 as its uint16 bits), after the device's queued work."""
        from .host_io import host_empty
        src = self.contiguous()
        out = host_empty(self.shape, self.dtype)
        src.device_obj.download(out, src)
        return out

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3 (CuPy, Numba, torch.as_tensor): bfloat16 has no typestr there."""
        from .host_io import TYPESTR
        if self.dtype not in TYPESTR:
            raise TypeError(f"{self.dtype} has no CUDA Array Interface typestr")
        return {"shape": self.shape, "typestr": TYPESTR[self.dtype], "data": (self.ptr, False), "version": 3,
                "strides": tuple(s * self.itemsize for s in self._strides), "stream": None}

    def __dlpack__(self, *, stream: int | None = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """A DLPack capsule of this view, zero-copy (`torch.from_dlpack(out)`, bfloat16 included).
        The work queued on XG's stream is finished first unless the consumer passes stream -1."""
        from .dlpack import KDL_CUDA, export
        if copy:
            raise BufferError("a DeviceArray exports its memory in place; copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, self.device_ref.index):
            raise BufferError(f"a DeviceArray lives on cuda:{self.device_ref.index}, not on DLPack device {dl_device}")
        if stream != -1 and isinstance(self.owner, Allocation):
            self.owner.device.synchronize()
        return export(self.ptr, self.shape, self._strides, self.dtype, (KDL_CUDA, self.device_ref.index), self)

    def __dlpack_device__(self) -> tuple[int, int]:
        from .dlpack import KDL_CUDA
        return KDL_CUDA, self.device_ref.index

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype}{list(self.shape)}, strides={list(self._strides)}, {self.device_ref})"


def _dense_ignoring_ones(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's rule: contiguous when the dims of size > 1 have the row-major strides (any numel 0)."""
    if math.prod(shape) == 0:
        return True
    acc = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1:
            if stride != acc:
                return False
            acc *= size
    return True


def _shape_arg(args: tuple) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(int(a) for a in args)


def _infer(old: Sequence[int], new: Sequence[int]) -> tuple[int, ...]:
    numel = math.prod(old)
    if sum(1 for s in new if s == -1) > 1:
        raise ValueError("only one dim may be -1")
    if -1 in new:
        rest = math.prod(s for s in new if s != -1)
        if rest == 0 or numel % rest:
            raise ValueError(f"cannot reshape {list(old)} to {list(new)}")
        new = tuple(numel // rest if s == -1 else s for s in new)
    if math.prod(new) != numel:
        raise ValueError(f"cannot reshape {list(old)} ({numel} elements) to {list(new)}")
    return tuple(new)


class CudaDevice:
    """One GPU for the deploy runtime: its primary context, a stream, pooled memory, copies.
    `CudaDevice.get(i)` keeps one per device in a process."""

    _devices: dict[int, "CudaDevice"] = {}
    _starting: dict[int, threading.Thread] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, index: int = 0) -> "CudaDevice":
        """The process's CudaDevice for GPU `index`, its context current on this thread."""
        starting = cls._starting.pop(index, None)
        if starting is not None:
            starting.join()
        with cls._lock:
            if index not in cls._devices:
                cls._devices[index] = cls(index)
            dev = cls._devices[index]
        dev.ensure_current()
        return dev

    @classmethod
    def start(cls, index: int = 0) -> None:
        """Start GPU `index` in the background (the driver's start and the context's creation take
        a few hundred ms): `get` waits for it, and raises what it raised."""
        if index in cls._devices or index in cls._starting:
            return

        def run() -> None:
            try:
                with cls._lock:
                    if index not in cls._devices:
                        cls._devices[index] = cls(index)
            except Exception:  # noqa: BLE001 (`get` starts it again in the caller's thread, and raises there)
                pass
        thread = threading.Thread(target=run, name=f"xg-cuda-start-{index}", daemon=True)
        cls._starting[index] = thread
        thread.start()

    def ensure_current(self) -> None:
        """Make the device's context current on the calling thread (each thread has its own)."""
        if int(check_call(self.drv.cuCtxGetCurrent(), "cuCtxGetCurrent")) != int(self.ctx):
            check_call(self.drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def __init__(self, index: int = 0) -> None:
        self.drv = drv = driver_module()
        try:
            init = drv.cuInit(0)
        except (RuntimeError, OSError) as exc:      # cuda-python's own error when libcuda cannot be loaded
            raise CudaRuntimeError(f"cannot load the CUDA driver: {exc}") from None
        if init[0]:
            raise CudaRuntimeError(f"no usable CUDA driver or GPU on this host (cuInit: "
                                   f"{getattr(init[0], 'name', init[0])})")
        count = check_call(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= index < count:
            raise CudaRuntimeError(f"no CUDA device {index}: {count} device(s) present")
        self.index = index
        self.ref = DeviceRef("cuda", index)
        self.handle = check_call(drv.cuDeviceGet(index), "cuDeviceGet")
        attr = drv.CUdevice_attribute
        major = check_call(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle),
                           "cuDeviceGetAttribute")
        minor = check_call(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle),
                           "cuDeviceGetAttribute")
        self.arch = major * 10 + minor
        name = check_call(drv.cuDeviceGetName(256, self.handle), "cuDeviceGetName")
        self.name = bytes(name).split(b"\0")[0].decode(errors="replace")
        self.ctx = check_call(drv.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        check_call(drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.stream = check_call(drv.cuStreamCreate(0), "cuStreamCreate")      # ordered with the legacy stream
        self.stream_handle = int(self.stream)
        pool = check_call(drv.cuDeviceGetDefaultMemPool(self.handle), "cuDeviceGetDefaultMemPool")
        keep = drv.cuuint64_t(2**64 - 1)        # freed blocks stay in the pool: runs reuse them
        check_call(drv.cuMemPoolSetAttribute(pool, drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, keep),
                   "cuMemPoolSetAttribute")
        self._host_refs: list = []      # host buffers of queued copies, kept until the stream syncs
        self._capturing: dict[int, Any] | None = None   # during a capture: pointer -> weakref of its Allocation
        self._deferred: list[int] = []  # frees of memory from before a capture, made once it ends

    # --- the launcher's memory backend (cuda.KernelLauncher) --------------------------------------
    def current_stream(self) -> int:
        return self.stream_handle

    def pointer(self, kernel: str, i: int, ty: str, a: Any, pointee: str) -> int:
        if not isinstance(a, DeviceArray):
            raise CudaRuntimeError(f"kernel `{kernel}` argument {i} (`{ty}`) must be a DeviceArray, "
                                   f"got {type(a).__name__}")
        if a.device_ref.index != self.index:
            raise CudaRuntimeError(f"kernel `{kernel}` argument {i} (`{ty}`) is on {a.device_ref}, "
                                   f"the kernel runs on cuda:{self.index}")
        if a.dtype != pointee:
            raise CudaRuntimeError(f"kernel `{kernel}` argument {i} (`{ty}`) must be {pointee}, got {a.dtype}")
        return a.ptr

    def scratch(self, nbytes: int, align: int, stream: int, keep: list) -> int:
        buf = self.alloc(nbytes + align - 1)
        keep.append(buf)
        return -(-buf.ptr // align) * align

    # --- memory ----------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Allocation:
        if nbytes <= 0:
            return Allocation(self, 0, 0)
        try:
            ptr = check_call(self.drv.cuMemAllocAsync(nbytes, self.stream), f"cuMemAllocAsync({nbytes})")
        except CudaRuntimeError as exc:
            raise CudaRuntimeError(f"out of GPU memory? allocating {nbytes} bytes on cuda:{self.index} failed: "
                                   f"{exc}") from None
        block = Allocation(self, int(ptr), nbytes)
        if self._capturing is not None:
            self._capturing[block.ptr] = weakref.ref(block)
        return block

    def free(self, ptr: int) -> None:
        if self._capturing is not None:
            if self._capturing.pop(ptr, None) is None:
                self._deferred.append(ptr)      # not the graph's: a free node may not take it
                return
        self.drv.cuMemFreeAsync(ptr, self.stream)

    # --- CUDA graphs -----------------------------------------------------------------------------
    def begin_capture(self) -> None:
        """Start capturing this device's stream into a CUDA graph: memory allocated and freed until
        `end_capture` becomes the graph's allocation and free nodes."""
        self._capturing, self._deferred = {}, []
        try:
            check_call(self.drv.cuStreamBeginCapture(
                self.stream, self.drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture")
        except CudaRuntimeError:
            self._capturing = None
            raise

    def end_capture(self) -> tuple[Any, list[int]]:
        """(the captured graph, the pointers of its allocations still in use: the graph's, freed by
        its next launch); raises CudaRuntimeError when the capture failed. Either way the stream
        leaves capture mode and frees deferred during it are made."""
        captured, self._capturing = self._capturing or {}, None
        err, graph = self.drv.cuStreamEndCapture(self.stream)
        owned = []
        for ptr, ref in captured.items():
            block = ref()
            if block is not None and block.ptr:
                block.ptr = 0               # the graph owns it now (instantiated to free it on relaunch)
                owned.append(ptr)
        deferred, self._deferred = self._deferred, []
        for ptr in deferred:
            self.free(ptr)
        if err:
            if graph is not None and int(graph):
                self.drv.cuGraphDestroy(graph)
            check_call((err,), "cuStreamEndCapture")
        return graph, owned

    def instantiate(self, graph: Any) -> Any:
        """An executable graph that frees its own allocations before each relaunch."""
        flags = self.drv.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
        return check_call(self.drv.cuGraphInstantiate(graph, int(flags)), "cuGraphInstantiate")

    def launch_graph(self, executable: Any) -> None:
        check_call(self.drv.cuGraphLaunch(executable, self.stream), "cuGraphLaunch")

    def destroy_graph(self, graph: Any, executable: Any, owned: Sequence[int]) -> None:
        """Free a launched graph's allocations and destroy it."""
        for ptr in owned:
            self.drv.cuMemFreeAsync(ptr, self.stream)
        if executable is not None:
            self.drv.cuGraphExecDestroy(executable)
        self.drv.cuGraphDestroy(graph)

    def copy_dense(self, dst: DeviceArray, src: DeviceArray) -> None:
        """dst <- src, both contiguous and of the same size, queued."""
        if src.nbytes:
            check_call(self.drv.cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, self.stream), "cuMemcpyDtoDAsync")

    def empty(self, shape: Sequence[int], dtype: str) -> DeviceArray:
        shape = tuple(int(s) for s in shape)
        block = self.alloc(math.prod(shape) * ITEMSIZE[dtype])
        return DeviceArray(block, block.ptr, shape, contiguous_strides(shape), dtype, self.ref)

    def zeros(self, shape: Sequence[int], dtype: str) -> DeviceArray:
        out = self.empty(shape, dtype)
        if out.nbytes:
            check_call(self.drv.cuMemsetD8Async(out.ptr, 0, out.nbytes, self.stream), "cuMemsetD8Async")
        return out

    def upload(self, host: Any, dtype: str) -> DeviceArray:
        """A device copy of a C-contiguous numpy array (bfloat16: its uint16 bits), queued."""
        out = self.empty(host.shape, dtype)
        if out.nbytes:
            check_call(self.drv.cuMemcpyHtoDAsync(out.ptr, host.ctypes.data, out.nbytes, self.stream),
                       "cuMemcpyHtoDAsync")
            self._host_refs.append(host)
        return out

    def download(self, host: Any, src: DeviceArray) -> None:
        """Copy contiguous `src` into C-contiguous numpy `host`, after the queued work."""
        if src.nbytes:
            check_call(self.drv.cuMemcpyDtoHAsync(host.ctypes.data, src.ptr, src.nbytes, self.stream),
                       "cuMemcpyDtoHAsync")
        self.synchronize()

    def synchronize(self) -> None:
        check_call(self.drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        self._host_refs.clear()

    def copy_strided(self, dst: DeviceArray, src: DeviceArray) -> None:
        """dst (contiguous, src's shape) <- src (any non-negative strides), with the runtime's
        strided-copy kernel (`copy_kernels.json`): the copy torch's executor makes with torch's."""
        if src.numel() == 0:
            return
        shape, strides = merged_dims(src.shape, src.stride())
        kernel, rank, block = self._copy_kernel(src.itemsize)
        lead = max(0, len(shape) - rank)
        outer, outer_strides = shape[:lead], strides[:lead]
        shape = [1] * (rank - len(shape[lead:])) + shape[lead:]
        strides = [0] * (rank - len(strides[lead:])) + strides[lead:]
        pieces = math.prod(outer)
        if pieces > MAX_COPY_CALLS:
            raise CudaRuntimeError(f"copying a {list(src.shape)} view with strides {list(src.stride())} would take "
                                   f"{pieces} launches; run this engine with torch installed")
        n = math.prod(shape)
        bits = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}[src.itemsize]
        for k, idx in enumerate(_indices(outer)):
            at = sum(i * s for i, s in zip(idx, outer_strides))
            a = DeviceArray(src.owner, src.ptr + at * src.itemsize, (n,), (1,), bits, self.ref)
            b = DeviceArray(dst.owner, dst.ptr + k * n * dst.itemsize, (n,), (1,), bits, self.ref)
            self.launcher.launch(kernel, (-(-n // block), 1, 1), [a, b, n, *shape[1:], *strides])

    @property
    def launcher(self) -> Any:
        """A KernelLauncher on this device (the runtime's own kernels)."""
        if getattr(self, "_launcher", None) is None:
            from .cuda import KernelLauncher
            self._launcher = KernelLauncher(self.index, memory=self)
        return self._launcher

    def _copy_kernel(self, itemsize: int) -> tuple[Any, int, int]:
        """The strided-copy kernel for `itemsize`-byte elements (PTX, compiled by the driver on load)."""
        from .cuda import KernelBinary
        table = _copy_kernels()
        meta = table["kernels"][str(itemsize)]
        k = KernelBinary.from_metadata({**meta, "arch": 0}, meta["ptx"].encode())
        return k, int(table["rank"]), int(table["block"])

    def foreign(self, ptr: int, shape: Sequence[int], strides: Sequence[int] | None, dtype: str,
                owner: Any) -> DeviceArray:
        """A view of memory another library allocated (DLPack, CUDA Array Interface); `owner` keeps it."""
        strides = contiguous_strides(shape) if strides is None else strides
        return DeviceArray(owner, ptr, shape, strides, dtype, self.ref)


def merged_dims(shape: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """`shape`/`strides` without dims of size 1 and with each run of dims that chain (stride of
    one = size x stride of the next) merged into one: the fewest dims that index the same elements."""
    out: list[tuple[int, int]] = []
    for n, s in ((int(n), int(s)) for n, s in zip(shape, strides) if n != 1):
        if out and out[-1][1] == n * s:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return [n for n, _ in out] or [1], [s for _, s in out] or [1]


_COPY_KERNELS: dict | None = None


def _copy_kernels() -> dict:
    global _COPY_KERNELS
    if _COPY_KERNELS is None:
        import json
        from importlib import resources
        _COPY_KERNELS = json.loads(resources.files(__package__).joinpath("copy_kernels.json").read_text())
    return _COPY_KERNELS


def _indices(shape: Sequence[int]) -> Iterable[tuple[int, ...]]:
    if not shape:
        yield ()
        return
    for head in range(shape[0]):
        for rest in _indices(shape[1:]):
            yield (head, *rest)


class CudaEvent:
    """A timing CUDA event on the device's stream (the profiler's `event`)."""

    def __init__(self, device: CudaDevice) -> None:
        self.device = device
        self.event = check_call(device.drv.cuEventCreate(0), "cuEventCreate")

    def record(self) -> None:
        check_call(self.device.drv.cuEventRecord(self.event, self.device.stream), "cuEventRecord")

    def elapsed_time(self, end: "CudaEvent") -> float:
        check_call(self.device.drv.cuEventSynchronize(end.event), "cuEventSynchronize")
        return float(check_call(self.device.drv.cuEventElapsedTime(self.event, end.event), "cuEventElapsedTime"))

    def __del__(self) -> None:
        try:
            self.device.drv.cuEventDestroy(self.event)
        except Exception:  # noqa: BLE001
            pass

