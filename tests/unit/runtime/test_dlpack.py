"""DLPack in the deploy runtime (`runtime/dlpack.py`), checked against a real producer and consumer
(torch) on the host: the structures' layout, every dtype (bfloat16 included), strides, the capsule
protocol (taken once, renamed, the deleter called exactly when the consumer is done) and the native
engine binding a DLPack input in place."""

from __future__ import annotations

import ctypes
import gc
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import xg
from xgbuild.errors import InputError
from xgbuild.runtime import dlpack
from xgbuild.runtime.device import DeviceArray, DeviceRef, contiguous_strides
from xgbuild.runtime.host_io import HostArray

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
          "bool": torch.bool}


class Producer:
    """A DLPack producer handing out one capsule (what torch.from_dlpack calls)."""
    def __init__(self, capsule, device=(dlpack.KDL_CPU, 0)) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **_kw):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_torch_tensors_are_read_in_place(name: str) -> None:
    g = torch.Generator().manual_seed(hash(name) % 1000)
    t = (torch.randn(3, 4, 5, generator=g) * 8).to(DTYPES[name]).permute(2, 0, 1)[1:]
    got = dlpack.take(t.__dlpack__(), "x")
    assert got.dtype == name and got.shape == tuple(t.shape) and got.strides == tuple(t.stride())
    assert got.ptr == t.data_ptr() and got.device == (dlpack.KDL_CPU, 0)
    dense = dlpack.take(t.contiguous().__dlpack__(), "y")
    assert dense.strides is None            # row-major: said as such


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_exports_are_read_by_torch_without_a_copy(name: str) -> None:
    rng = np.random.default_rng(len(name))
    host = torch.from_numpy(rng.standard_normal((6, 5)).astype(np.float32) * 8).to(DTYPES[name]).contiguous()
    before = len(dlpack._EXPORTED)
    capsule = dlpack.export(host.data_ptr(), (5, 6), (1, 5), name, (dlpack.KDL_CPU, 0), host)   # a transposed view
    t = torch.from_dlpack(Producer(capsule))
    assert t.dtype == DTYPES[name] and t.data_ptr() == host.data_ptr()
    assert torch.equal(t, host.T)
    assert len(dlpack._EXPORTED) == before + 1
    del capsule
    gc.collect()
    assert len(dlpack._EXPORTED) == before + 1      # torch still holds it
    del t
    gc.collect()
    assert len(dlpack._EXPORTED) == before          # torch called the deleter


def test_a_capsule_nobody_takes_is_freed_and_a_taken_one_cannot_be_taken_again() -> None:
    before = len(dlpack._EXPORTED)
    keep = np.zeros(4, np.float32)
    capsule = dlpack.export(keep.ctypes.data, (4,), (1,), "float32", (dlpack.KDL_CPU, 0), keep)
    del capsule
    gc.collect()
    assert len(dlpack._EXPORTED) == before
    t = torch.ones(3)
    capsule = t.__dlpack__()
    got = dlpack.take(capsule, "x")
    with pytest.raises(ValueError, match="no fresh 'dltensor' capsule"):
        dlpack.take(capsule, "x")
    del got
    gc.collect()
    with pytest.raises(TypeError, match="no DLPack type"):
        dlpack.export(0, (1,), (1,), "complex64", (1, 0), None)


def test_lanes_and_unknown_codes_are_refused() -> None:
    keep = np.zeros(4, np.float32)
    for code, bits, lanes in ((2, 32, 4), (5, 64, 1), (2, 8, 1)):
        capsule = dlpack.export(keep.ctypes.data, (4,), (1,), "float32", (dlpack.KDL_CPU, 0), keep)
        managed = dlpack._Managed.from_address(dlpack._pointer(capsule, b"dltensor"))
        managed.dl_tensor.dtype = dlpack._DataType(code, bits, lanes)
        with pytest.raises(ValueError, match="is not an XG dtype"):
            dlpack.take(capsule, "input `X`")


class Device:
    """What the native engine asks of a device to bind foreign memory, without a GPU."""
    ref, stream_handle = DeviceRef("cuda", 0), 1234

    def foreign(self, ptr, shape, strides, dtype, owner):
        return DeviceArray(owner, ptr, shape, strides if strides is not None else contiguous_strides(shape),
                           dtype, self.ref)


def test_the_native_engine_binds_dlpack_inputs_in_place(tmp_path) -> None:
    from xgbuild.runtime.native import NativeEngine
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[bfloat16, T, D] X\nextern Tensor[float32, D] G\ndef main() {\n    return X\n}\n")
    xg.compile_file(src, kernels=False).save(tmp_path / "m.xge")
    eng = NativeEngine.load(tmp_path / "m.xge")
    eng._executor = SimpleNamespace(device=Device())
    x = torch.randn(8, 4).to(torch.bfloat16)
    streams = []

    class OnGpu(Producer):      # a CUDA tensor as a producer presents it (the memory is host memory here)
        def __dlpack__(self, stream=None, **_kw):
            streams.append(stream)
            return self.capsule
    g = np.arange(4, dtype=np.float32)
    out = eng.check_inputs({"X": OnGpu(x.__dlpack__(), (dlpack.KDL_CUDA, 0)), "G": torch.from_numpy(g)})
    assert isinstance(out["X"], DeviceArray) and out["X"].data_ptr() == x.data_ptr()
    assert out["X"].dtype == "bfloat16" and out["X"].shape == (8, 4) and streams == [1234]
    assert isinstance(out["G"], HostArray) and out["G"].dtype == "float32"   # a host tensor: read by numpy
    assert np.array_equal(out["G"].array, g)
    with pytest.raises(InputError, match="on cuda:1, the engine runs on cuda:0"):
        eng.check_inputs({"X": OnGpu(x.__dlpack__(), (dlpack.KDL_CUDA, 1)), "G": g})
    with pytest.raises(InputError, match="DLPack device type 8"):
        eng.check_inputs({"X": OnGpu(x.__dlpack__(), (8, 0)), "G": g})
    with pytest.raises(InputError, match="dtype float32"):
        eng.check_inputs({"X": OnGpu(torch.randn(8, 4).__dlpack__(), (dlpack.KDL_CUDA, 0)), "G": g})
    with pytest.raises(InputError, match="numpy cannot take this host tensor"):
        eng.check_inputs({"X": x, "G": g})        # a bfloat16 host tensor: numpy has no bfloat16


def test_device_arrays_export_to_dlpack() -> None:
    keep = torch.arange(12, dtype=torch.float32)
    arr = DeviceArray(keep, keep.data_ptr(), (3, 4), (4, 1), "float32", DeviceRef("cuda", 0))
    assert arr.__dlpack_device__() == (dlpack.KDL_CUDA, 0)
    got = dlpack.take(arr.transpose(0, 1).__dlpack__(stream=-1), "y")
    assert got.ptr == keep.data_ptr() and got.shape == (4, 3) and got.strides == (1, 4)
    assert got.device == (dlpack.KDL_CUDA, 0) and got.dtype == "float32"
    with pytest.raises(BufferError, match="copy=True"):
        arr.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not on DLPack device"):
        arr.__dlpack__(dl_device=(1, 0))
    assert ctypes.sizeof(dlpack._Tensor) == 48 and ctypes.sizeof(dlpack._Managed) == 64   # dlpack.h's
