"""Launches ahead-of-time Triton cubins through the CUDA driver API: no Triton JIT or compile at run time.

A `KernelBinary` is what an engine stores per kernel; `KernelLauncher` loads it into the device's
primary context (`cuModuleLoadData`) and launches it (`cuLaunchKernel`) on a stream: torch's current
one, with torch tensors as arguments (`TorchMemory`), or the deploy runtime's (`device.CudaDevice`,
DeviceArrays, no torch).
The launch mirrors Triton 3.6's own launcher (`triton/backends/nvidia/driver.py`):

- the PTX entry takes the non-constexpr parameters in order, then two pointers: the global
  scratch and the profile scratch. Each is NULL when its size is 0, else a buffer of
  `size * programs` bytes (programs = gridX*gridY*gridZ; XG launches `num_ctas == 1` only);
- block = 32 * num_warps threads; dynamic shared memory = `shared`, and above 48 KiB the
  function's dynamic limit is raised to the device's opt-in maximum first, as `loadBinary` does;
- float scalars are passed as their bit patterns: bf16 keeps the top 16 bits of the fp32 value
  (truncation, like Triton's `pack_bf16`), fp16 rounds to nearest.

Importing this module touches neither torch, CUDA nor `cuda.bindings`: each loads on first use, so
CPU-only hosts (and deploy hosts without torch) import it freely.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import XGError

_SHARED_DEFAULT_LIMIT = 48 * 1024  # above this, a kernel must opt in to more dynamic shared memory
_EM_CUDA = 190
_SLOT = 8  # every parameter fits an 8-byte slot of the argument block
# Scalar type -> `struct` code, Triton's `ty_to_cpp` widths; bf16 travels as its 16 bits ("H").
_SCALARS = {"i1": "B", "u1": "B", "i8": "b", "u8": "B", "i16": "h", "u16": "H", "i32": "i", "u32": "I",
            "i64": "q", "u64": "Q", "fp16": "e", "bf16": "H", "fp32": "f", "f32": "f", "fp64": "d"}
_FLOATS = ("fp16", "bf16", "fp32", "f32", "fp64")
# Triton pointer element type -> torch dtype name (looked up lazily: some are missing in old torch).
_POINTEE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "f32": "float32",
            "fp64": "float64", "i1": "bool", "i8": "int8", "i16": "int16", "i32": "int32",
            "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
            "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2",
            "fp8e4b8": "float8_e4m3fnuz", "fp8e5b16": "float8_e5m2fnuz"}


class CudaRuntimeError(XGError):
    """Loading or launching a kernel on the GPU failed, or no usable GPU is present."""


def cubin_arch(cubin: bytes) -> int:
    """The SM number (90 for sm_90 and sm_90a) written in a cubin's ELF header.

    NVIDIA's ELF ABI v1 (`EI_ABIVERSION` 7, ptxas up to sm_90 in CUDA 12.x) keeps it in the low
    byte of `e_flags` (0x5a0d5a: sm_90, virtual 90 in bits 16-23, 0x800 = the `a` variant);
    ABI v2 (`EI_ABIVERSION` 8, Blackwell, and every target from CUDA 13) in bits 8-15
    (0x0900640a: sm_100, 0x8 = the `a` variant). Names as in LLVM's BinaryFormat/ELF.h.
    """
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise CudaRuntimeError("not a cubin: expected a 64-bit ELF image")
    (machine,) = struct.unpack_from("<H", cubin, 0x12)
    if machine != _EM_CUDA:
        raise CudaRuntimeError(f"not a cubin: ELF e_machine is {machine}, expected {_EM_CUDA} (EM_CUDA)")
    (flags,) = struct.unpack_from("<I", cubin, 0x30)
    abi = cubin[8]
    if abi == 7:
        return flags & 0xFF
    if abi == 8:
        return (flags >> 8) & 0xFF
    raise CudaRuntimeError(f"cubin has an unknown CUDA ELF ABI version {abi} (known: 7, 8)")


@dataclass(frozen=True)
class KernelBinary:
    """One compiled kernel as an engine stores it: cubin plus everything needed to launch it."""

    name: str                  # entry symbol (metadata.name)
    arch: int                  # sm_XX as an int: 90, 100
    cubin: bytes
    num_warps: int
    shared: int                # dynamic shared memory, bytes
    params: tuple[str, ...]    # Triton types of the non-constexpr parameters: "*fp32", "i32", "fp32"
    global_scratch_size: int = 0
    global_scratch_align: int = 1
    profile_scratch_size: int = 0
    profile_scratch_align: int = 1

    def __post_init__(self) -> None:
        for ty in self.params:
            if not (ty in _SCALARS or (ty[:1] == "*" and ty[1:] in _POINTEE)):
                raise CudaRuntimeError(f"kernel `{self.name}`: unsupported parameter type `{ty}`")

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the cubin: the key a launcher caches the loaded module under."""
        return hashlib.sha256(self.cubin).hexdigest()

    @functools.cached_property
    def layout(self) -> struct.Struct:
        """The argument block: one 8-byte slot per parameter, then the two scratch pointers."""
        codes = ["Q" if ty[0] == "*" else _SCALARS[ty] for ty in self.params] + ["Q", "Q"]
        return struct.Struct("<" + "".join(f"{c}{_SLOT - struct.calcsize(c)}x" for c in codes))

    @functools.cached_property
    def bf16_slots(self) -> tuple[int, ...]:
        """Parameters passed as bf16 bits, which `struct` cannot make itself."""
        return tuple(i for i, ty in enumerate(self.params) if ty == "bf16")

    @functools.cached_property
    def pointer_dtypes(self) -> tuple[tuple[int, str], ...]:
        """(position, dtype name its tensor must have, torch's spelling) for each pointer parameter."""
        return tuple((i, _POINTEE[ty[1:]]) for i, ty in enumerate(self.params) if ty[0] == "*")

    def metadata(self) -> dict:
        """Everything but the cubin, as JSON: what a cache record or an engine manifest stores."""
        return {"entry": self.name, "arch": self.arch, "num_warps": self.num_warps, "shared": self.shared,
                "param_types": list(self.params),
                "global_scratch": [self.global_scratch_size, self.global_scratch_align],
                "profile_scratch": [self.profile_scratch_size, self.profile_scratch_align]}

    @classmethod
    def from_metadata(cls, meta: dict, cubin: bytes) -> KernelBinary:
        """The inverse of `metadata`; KeyError/TypeError/ValueError on a malformed one."""
        return cls(name=str(meta["entry"]), arch=int(meta["arch"]), cubin=bytes(cubin),
                   num_warps=int(meta["num_warps"]), shared=int(meta["shared"]),
                   params=tuple(str(t) for t in meta["param_types"]),
                   global_scratch_size=int(meta["global_scratch"][0]),
                   global_scratch_align=int(meta["global_scratch"][1]),
                   profile_scratch_size=int(meta["profile_scratch"][0]),
                   profile_scratch_align=int(meta["profile_scratch"][1]))

    @classmethod
    def from_compiled(cls, compiled: Any, params: Sequence[str]) -> KernelBinary:
        """From a `triton.compile` result; `params` lists the non-constexpr parameter types."""
        md = compiled.metadata
        refused = [what for what, bad in (("num_ctas > 1", getattr(md, "num_ctas", 1) != 1),
                                          ("launch_cooperative_grid", md.launch_cooperative_grid),
                                          ("launch_pdl", md.launch_pdl)) if bad]
        if refused:
            raise CudaRuntimeError(f"kernel `{md.name}` uses {', '.join(refused)}, which XG cannot launch yet")
        k = cls(name=md.name, arch=int(md.target.arch), cubin=bytes(compiled.asm["cubin"]),
                num_warps=md.num_warps, shared=md.shared, params=tuple(params),
                global_scratch_size=md.global_scratch_size, global_scratch_align=md.global_scratch_align,
                profile_scratch_size=md.profile_scratch_size, profile_scratch_align=md.profile_scratch_align)
        ptx = compiled.asm.get("ptx")
        if ptx:  # the entry must take exactly `params` then the two scratch pointers, size for size
            want = [struct.calcsize("Q" if ty[0] == "*" else _SCALARS[ty]) for ty in params] + [8, 8]
            got = _ptx_param_sizes(ptx, md.name)
            if got != want:
                raise CudaRuntimeError(f"kernel `{md.name}`: its PTX entry takes parameters of {got} bytes, "
                                       f"`params` {tuple(params)} + 2 scratch pointers make {want}")
        return k


def _ptx_param_sizes(ptx: str, name: str) -> list[int]:
    """Byte size of each parameter of PTX entry `name`: `.param .u32 p` is 4, `.param .b8 p[2]` is 2."""
    entry = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.DOTALL)
    sizes = []
    for decl in entry.group(1).split(",") if entry else []:
        array = re.search(r"\[(\d+)\]", decl)
        width = re.search(r"\.[usbf](\d+)\b", decl)
        sizes.append(int(array.group(1)) if array else int(width.group(1)) // 8 if width else 0)
    return sizes


def pack_args(k: KernelBinary, args: Sequence[Any], device_index: int, memory: Any = None) -> bytes:
    """Checks `args` against `k.params` and returns the argument block (`k.layout`, NULL scratch).
    `memory` checks each pointer argument and gives its address (default: torch tensors)."""
    if len(args) != len(k.params):
        raise CudaRuntimeError(f"kernel `{k.name}` takes {len(k.params)} arguments "
                               f"({', '.join(k.params)}), got {len(args)}")
    memory = memory or TorchMemory(device_index)
    values = list(args)
    for i, pointee in k.pointer_dtypes:
        values[i] = memory.pointer(k.name, i, k.params[i], args[i], pointee)
    try:
        for i in k.bf16_slots:
            values[i] = _bf16_bits(args[i])
        return k.layout.pack(*values, 0, 0)
    except (struct.error, OverflowError, TypeError):
        raise CudaRuntimeError(_scalar_problem(k, args)) from None


class TorchMemory:
    """The launcher's memory backend for torch tensors on one device: pointer checks, scratch from
    torch's caching allocator, torch's current stream."""

    def __init__(self, device_index: int) -> None:
        import torch
        self.torch, self.device_index = torch, device_index
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton uses: no Stream object
        self.current_stream = (lambda: raw(device_index)) if raw else (
            lambda: torch.cuda.current_stream(device_index).cuda_stream)

    def pointer(self, kernel: str, i: int, ty: str, a: Any, pointee: str) -> int:
        torch = self.torch
        where = f"kernel `{kernel}` argument {i} (`{ty}`)"
        if not isinstance(a, torch.Tensor):
            raise CudaRuntimeError(f"{where} must be a CUDA tensor, got {type(a).__name__}")
        if not a.is_cuda or a.get_device() != self.device_index:
            raise CudaRuntimeError(f"{where} must be a tensor on cuda:{self.device_index}, got one on {a.device}")
        if a.dtype != getattr(torch, pointee, None):
            raise CudaRuntimeError(f"{where} must be a torch.{pointee} tensor, got {a.dtype}")
        return a.data_ptr()

    def scratch(self, nbytes: int, align: int, stream: int, keep: list) -> int:
        torch = self.torch
        buf = torch.empty(nbytes + align - 1, dtype=torch.uint8, device=f"cuda:{self.device_index}")
        if stream != self.current_stream():
            # the caching allocator must not hand the block to its stream while ours still runs
            buf.record_stream(torch.cuda.ExternalStream(stream, device=buf.device))
        keep.append(buf)
        return -(-buf.data_ptr() // align) * align


def _bf16_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16


def _scalar_problem(k: KernelBinary, args: Sequence[Any]) -> str:
    """Names the first scalar argument that `struct` refused to pack."""
    for i, (ty, a) in enumerate(zip(k.params, args)):
        where = f"kernel `{k.name}` argument {i} (`{ty}`)"
        if ty[0] == "*":
            continue
        if ty in _FLOATS:
            if not isinstance(a, (int, float)):
                return f"{where} must be a float, got {a!r}"
            try:
                struct.pack(_SCALARS[ty], _bf16_bits(a) if ty == "bf16" else a)
            except (struct.error, OverflowError):
                return f"{where}: {a!r} does not fit in {ty}"
            continue
        bits = 8 * struct.calcsize(_SCALARS[ty])
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if _SCALARS[ty].islower() else (0, 2**bits - 1)
        if not isinstance(a, int) or not lo <= a <= hi:
            return f"{where} must be an int in [{lo}, {hi}], got {a!r}"
    return f"kernel `{k.name}`: arguments do not match ({', '.join(k.params)})"


def driver_module() -> Any:
    """`cuda.bindings.driver`, or a CudaRuntimeError saying how to install it."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaRuntimeError(f"cuda-python is not installed (`cuda.bindings`; pip install 'xg[runtime]'): "
                               f"{exc}") from None
    return driver


def driver_version() -> str | None:
    """The installed CUDA driver's version ("12.8"), or None without cuda-python or a loadable driver."""
    try:
        err, version = driver_module().cuDriverGetVersion()
    except (CudaRuntimeError, RuntimeError, OSError):   # cuda-python's own when libcuda is not found
        return None
    if err:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def check_call(result: tuple, call: str) -> Any:
    """Unwraps a cuda-python `(CUresult, values...)` tuple; a failure names the call and the error."""
    err = result[0]
    if err:  # CUresult is an int enum and CUDA_SUCCESS is 0
        try:
            ok, text = driver_module().cuGetErrorString(err)
            detail = f" ({text.decode()})" if not ok and text else ""
        except Exception:  # noqa: BLE001 (no driver to describe it: the error's name is the message)
            detail = ""
        raise CudaRuntimeError(f"{call} failed: {getattr(err, 'name', err)}{detail}")
    return result[1] if len(result) == 2 else result[1:] or None


def device_arch(device_index: int = 0) -> int:
    """Compute capability of a torch CUDA device as major*10 + minor (90 on H100)."""
    import torch
    if not torch.cuda.is_available():
        raise CudaRuntimeError("no CUDA device: torch.cuda.is_available() is False")
    major, minor = torch.cuda.get_device_capability(device_index)
    return major * 10 + minor


@dataclass
class _Loaded:
    """A loaded kernel and its reusable argument block (the driver copies it at each launch)."""

    module: Any
    function: Any
    block: ctypes.Array     # the argument block, `KernelBinary.layout`
    pointers: ctypes.Array  # the void*[] that cuLaunchKernel takes: one entry per slot of `block`


class KernelLauncher:
    """Loads `KernelBinary`s into one device's primary context (torch's) and launches them."""

    def __init__(self, device_index: int = 0, memory: Any = None) -> None:
        """`memory`: pointers, scratch and the stream come from it (`device.CudaDevice`); by
        default from torch (`TorchMemory`), whose device must exist."""
        if memory is None:
            import torch
            if not torch.cuda.is_available():
                raise CudaRuntimeError("no CUDA device: torch.cuda.is_available() is False")
            if not 0 <= device_index < torch.cuda.device_count():
                raise CudaRuntimeError(f"no CUDA device {device_index}: {torch.cuda.device_count()} device(s) present")
            memory = TorchMemory(device_index)
            arch = device_arch(device_index)
        else:
            arch = memory.arch
        self.memory = memory
        self._drv = drv = driver_module()
        try:
            init = drv.cuInit(0)
        except (RuntimeError, OSError) as exc:  # cuda-python's own error when libcuda cannot be loaded
            raise CudaRuntimeError(f"cannot load the CUDA driver: {exc}") from None
        check_call(init, "cuInit")
        self.device_index = device_index
        self.arch = arch
        self._device = check_call(drv.cuDeviceGet(device_index), "cuDeviceGet")
        # The primary context is the one torch's runtime uses, so tensors' pointers are valid in it.
        self._ctx = check_call(drv.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain")
        self._shared_optin = check_call(drv.cuDeviceGetAttribute(
            drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self._device),
            "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
        self._loaded: dict[tuple[str, str], _Loaded] = {}  # (cubin digest, entry name) -> kernel
        self._lock = threading.Lock()  # argument blocks are shared by all threads launching a kernel
        self._current_stream = memory.current_stream
        # While a list: each launch's (kernel, CUfunction, grid, argument block) is appended to it
        # (a CUDA graph capture, `rebind.Binder`).
        self.recording: list | None = None

    def _enter(self) -> bool:
        """Makes our context current; True when the caller's must be restored (`_exit`)."""
        current = check_call(self._drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) == int(self._ctx):
            return False
        check_call(self._drv.cuCtxPushCurrent(self._ctx), "cuCtxPushCurrent")
        return True

    def _exit(self, pushed: bool) -> None:
        if pushed:
            check_call(self._drv.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def load(self, k: KernelBinary) -> Any:
        """Loads `k`'s cubin once (cached by cubin sha256 and entry name); returns its CUfunction."""
        return self._load(k).function

    def _load(self, k: KernelBinary) -> _Loaded:
        loaded = self._loaded.get((k.digest, k.name))
        if loaded is None:
            with self._lock:  # one module per kernel, also when threads race to load it
                loaded = self._loaded.get((k.digest, k.name)) or self._load_new(k)
        return loaded

    def _load_new(self, k: KernelBinary) -> _Loaded:
        ptx = k.arch == 0               # PTX (the runtime's own kernels): the driver compiles it for this GPU
        if not ptx and k.arch != self.arch:
            raise CudaRuntimeError(f"kernel `{k.name}` built for sm_{k.arch}, device is sm_{self.arch}")
        if not ptx and cubin_arch(k.cubin) != k.arch:
            raise CudaRuntimeError(f"kernel `{k.name}` says sm_{k.arch} but its cubin is for sm_{cubin_arch(k.cubin)}")
        if k.shared > max(self._shared_optin, _SHARED_DEFAULT_LIMIT):
            raise CudaRuntimeError(f"kernel `{k.name}` needs {k.shared} bytes of shared memory, "
                                   f"device allows {self._shared_optin}")
        drv = self._drv
        data = k.cubin + b"\0" if ptx else k.cubin
        image = (ctypes.c_char * len(data)).from_buffer_copy(data)
        pushed = self._enter()
        try:
            module = check_call(drv.cuModuleLoadData(ctypes.addressof(image)), f"cuModuleLoadData({k.name})")
            try:
                fn = check_call(drv.cuModuleGetFunction(module, k.name.encode()), f"cuModuleGetFunction({k.name})")
                if k.shared > _SHARED_DEFAULT_LIMIT:
                    attr = drv.CUfunction_attribute
                    check_call(drv.cuFuncSetCacheConfig(fn, drv.CUfunc_cache.CU_FUNC_CACHE_PREFER_SHARED),
                           "cuFuncSetCacheConfig")
                    static = check_call(drv.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                                    "cuFuncGetAttribute(SHARED_SIZE_BYTES)")
                    check_call(drv.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                  self._shared_optin - static),
                           "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
            except CudaRuntimeError:
                drv.cuModuleUnload(module)
                raise
        finally:
            self._exit(pushed)
        block = ctypes.create_string_buffer(k.layout.size)
        slots = k.layout.size // _SLOT
        pointers = (ctypes.c_void_p * slots)(*[ctypes.addressof(block) + _SLOT * i for i in range(slots)])
        loaded = _Loaded(module, fn, block, pointers)
        self._loaded[(k.digest, k.name)] = loaded
        return loaded

    def _scratch(self, size: int, align: int, programs: int, stream: int, keep: list) -> int:
        """A per-program scratch buffer as Triton's launcher allocates it, or NULL when size is 0."""
        if size == 0:
            return 0
        return self.memory.scratch(size * programs, align, stream, keep)

    def launch(self, k: KernelBinary, grid: tuple[int, int, int], args: Sequence[Any],
               stream: int | None = None) -> None:
        """Launches `k` on `grid` programs, asynchronously on `stream` (torch's current by default)."""
        if len(grid) != 3 or not all(isinstance(g, int) and g >= 0 for g in grid):
            raise CudaRuntimeError(f"kernel `{k.name}`: grid must be 3 non-negative ints, got {grid!r}")
        data = pack_args(k, args, self.device_index, self.memory)  # validates before anything is loaded or allocated
        loaded = self._load(k)
        programs = grid[0] * grid[1] * grid[2]
        if programs == 0:  # Triton skips empty grids too
            return
        if stream is None:
            stream = self._current_stream()
        keep: list = []  # scratch lives until the launch is enqueued (stream-ordered frees)
        scratch = (self._scratch(k.global_scratch_size, k.global_scratch_align, programs, stream, keep),
                   self._scratch(k.profile_scratch_size, k.profile_scratch_align, programs, stream, keep))
        with self._lock:
            ctypes.memmove(loaded.block, data, len(data))
            if any(scratch):  # the last two slots
                struct.pack_into("<QQ", loaded.block, len(data) - 2 * _SLOT, *scratch)
            pushed = self._enter()
            try:
                check_call(self._drv.cuLaunchKernel(loaded.function, grid[0], grid[1], grid[2], 32 * k.num_warps,
                                                1, 1, k.shared, stream, ctypes.addressof(loaded.pointers), 0),
                       f"cuLaunchKernel({k.name})")
            finally:
                self._exit(pushed)
            if self.recording is not None:
                self.recording.append((k, int(loaded.function), grid, loaded.block.raw))

    def close(self) -> None:
        """Unloads every module and releases the primary context this launcher retained."""
        pushed = self._enter()
        try:
            for loaded in self._loaded.values():
                check_call(self._drv.cuModuleUnload(loaded.module), "cuModuleUnload")
        finally:
            self._exit(pushed)
        self._loaded.clear()
        check_call(self._drv.cuDevicePrimaryCtxRelease(self._device), "cuDevicePrimaryCtxRelease")
