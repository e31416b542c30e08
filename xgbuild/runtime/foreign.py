"""Other libraries' arrays as the deploy runtime's inputs: which DLPack device a producer's tensor
is on (`dlpack.py` binds the capsule itself), and CUDA Array Interface objects (CuPy, Numba, …)
read in place as `DeviceArray`s, their dtype and strides checked."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import ITEMSIZE
from ..errors import InputError
from .device import CudaDevice, DeviceArray
from .host_io import NUMPY_DTYPES


def dlpack_device(name: str, obj: Any) -> tuple[int, int] | None:
    """(DLPack device type, index) of a DLPack producer, or None for anything else."""
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None or not hasattr(obj, "__dlpack__"):
        return None
    try:
        kind, index = probe()
        return int(kind), int(index)
    except Exception as exc:  # noqa: BLE001 (another library's refusal, whatever its type)
        raise InputError(f"input `{name}`: its __dlpack_device__ failed ({exc})") from None


def cuda_array_interface(name: str, obj: Any) -> dict | None:
    """`obj`'s CUDA Array Interface, or None when it has none; one it cannot give for its dtype
    (torch's bfloat16 tensors) is an InputError."""
    try:
        return obj.__cuda_array_interface__
    except AttributeError:
        return None
    except TypeError as exc:
        raise InputError(f"input `{name}` is GPU memory without a CUDA Array Interface for its dtype ({exc}); "
                         "pass it as a DeviceArray or a host array") from None


def cai_dtype(name: str, obj: Any) -> str:
    typestr = cuda_array_interface(name, obj)["typestr"]
    dtypes = {np.dtype(t).str: n for n, t in NUMPY_DTYPES.items() if n != "bfloat16"}
    try:
        dtype = dtypes.get(np.dtype(typestr).str)
    except TypeError:
        dtype = None
    if dtype is None:
        raise InputError(f"input `{name}`: CUDA array typestr {typestr!r} is not an XG dtype")
    return dtype


def from_cai(dev: CudaDevice, name: str, obj: Any) -> DeviceArray:
    """A DeviceArray over another library's CUDA memory (CUDA Array Interface), zero-copy."""
    cai = cuda_array_interface(name, obj)
    dtype = cai_dtype(name, obj)
    shape = tuple(cai["shape"])
    isz = ITEMSIZE[dtype]
    strides = None
    if cai.get("strides") is not None:
        if any(s % isz or s < 0 for s in cai["strides"]):
            raise InputError(f"input `{name}`: strides {cai['strides']} are not non-negative multiples of {isz} bytes")
        strides = tuple(s // isz for s in cai["strides"])
    return dev.foreign(int(cai["data"][0]), shape, strides, dtype, obj)
