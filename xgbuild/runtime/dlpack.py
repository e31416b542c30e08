"""DLPack for the deploy runtime, with ctypes only (no torch): a `DeviceArray` is exported as a
DLPack capsule (`__dlpack__`, `__dlpack_device__`: `torch.from_dlpack`, `cupy.from_dlpack`,
`jax.dlpack` take XG's outputs without a copy, bfloat16 included, which the CUDA Array Interface
cannot express), and any DLPack producer's CUDA tensor is bound as an input in place.

The structures are DLPack's (`dlpack.h`, the unversioned `DLManagedTensor` every consumer reads):

    DLTensor        {void* data; DLDevice {int32 type, int32 id}; int32 ndim;
                     DLDataType {uint8 code, uint8 bits, uint16 lanes}; int64* shape; int64* strides;
                     uint64 byte_offset}
    DLManagedTensor {DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*)}

A capsule is named "dltensor" until a consumer takes it (it renames it "used_dltensor" and calls the
deleter when it is done); a capsule nobody took calls the deleter when it is freed.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Sequence

KDL_CPU, KDL_CUDA = 1, 2
# (type code, bits) of each XG dtype: int 0, uint 1, float 2, bfloat 4, bool 6
CODES = {"int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8),
         "float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16), "bool": (6, 8)}
DTYPES = {v: k for k, v in CODES.items()}

_NAME, _USED = b"dltensor", b"used_dltensor"


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# The C API, called with raw pointers (a capsule being destroyed must not be touched as an object).
_api = ctypes.pythonapi
_capsule_new = _api.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))

_EXPORTED: dict[int, tuple] = {}       # address of a DLManagedTensor -> what keeps it and its memory


@_DELETER
def _delete(managed) -> None:
    _EXPORTED.pop(ctypes.addressof(managed.contents), None)


@ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule) -> None:
    # Only a capsule no consumer took still holds its tensor (a taken one was renamed).
    if _is_valid_raw(capsule, _NAME):
        address = _pointer_raw(capsule, _NAME)
        if address:
            _EXPORTED.pop(address, None)


def export(ptr: int, shape: Sequence[int], strides: Sequence[int], dtype: str, device: tuple[int, int],
           owner: Any) -> Any:
    """A DLPack capsule of the memory at `ptr` (`strides` in elements), kept alive through `owner`
    until the consumer is done with it."""
    if dtype not in CODES:
        raise TypeError(f"{dtype} has no DLPack type")
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
    code, bits = CODES[dtype]
    managed = _Managed()
    managed.dl_tensor = _Tensor(ptr, _Device(*device), ndim, _DataType(code, bits, 1),
                                ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)),
                                ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)), 0)
    managed.manager_ctx = None
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    _EXPORTED[address] = (managed, shape_arr, strides_arr, owner)
    return _capsule_new(address, _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


@dataclass(frozen=True)
class Imported:
    """A DLPack tensor taken from its capsule: where it is (`device`: (type, id)), its layout
    (strides in elements, None when row-major) and `keep`, which calls the producer's deleter
    when the last view of it is gone."""
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: str
    device: tuple[int, int]
    keep: Any


class _Release:
    """Calls a DLManagedTensor's deleter once, when no view needs its memory any more."""
    __slots__ = ("address", "capsule")

    def __init__(self, address: int, capsule: Any) -> None:
        self.address, self.capsule = address, capsule

    def __del__(self) -> None:
        managed = _Managed.from_address(self.address)
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))


def take(capsule: Any, what: str) -> Imported:
    """The tensor in a DLPack capsule, which this takes (renamed "used_dltensor", as consumers do);
    `what` names it in errors (ValueError: not a fresh capsule, a dtype XG lacks, vector lanes)."""
    if not _is_valid(capsule, _NAME):
        raise ValueError(f"{what}: __dlpack__ gave no fresh 'dltensor' capsule (a versioned or used one)")
    address = _pointer(capsule, _NAME)
    t = _Managed.from_address(address).dl_tensor
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in DTYPES:
        raise ValueError(f"{what}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) "
                         "is not an XG dtype")
    if t.ndim < 0 or t.ndim > 64:
        raise ValueError(f"{what}: DLPack tensor of rank {t.ndim}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides and t.ndim else None
    if any(n < 0 for n in shape) or (strides is not None and any(s < 0 for s in strides)):
        raise ValueError(f"{what}: DLPack shape {list(shape)} or strides {list(strides or ())} are negative")
    _set_name(capsule, _USED)
    keep = _Release(address, capsule)
    ptr = (t.data or 0) + t.byte_offset
    if strides is not None and math.prod(shape) and strides == _row_major(shape):
        strides = None
    return Imported(ptr, shape, strides, DTYPES[key], (t.device.type, t.device.id), keep)


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))
