"""CPU-runnable tests of `xgbuild.runtime.cuda`: KernelBinary from a cross-compiled kernel, the cubin
ELF arch decoder, argument packing and refusals, and clean errors on a host without a GPU.

Kernels are compiled here for sm_80/90/100 with `triton.compile` + `GPUTarget`, which needs no GPU.
"""

from __future__ import annotations

import ctypes
import math
import struct
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from xgbuild.errors import XGError
from xgbuild.runtime.cuda import CudaRuntimeError, KernelBinary, KernelLauncher, cubin_arch, pack_args

ADD_PARAMS = ("*fp32", "*fp32", "*fp32", "i32")


@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _compile_add(arch: int, **options):
    signature = dict(zip(("x_ptr", "y_ptr", "out_ptr", "n"), ADD_PARAMS), BLOCK="constexpr")
    return triton.compile(ASTSource(_add, signature, {"BLOCK": 256}), target=GPUTarget("cuda", arch, 32),
                          options=options)


@pytest.fixture(scope="module")
def compiled() -> dict:
    return {arch: _compile_add(arch, num_warps=2) for arch in (80, 90, 100)}


def test_from_compiled_fields(compiled):
    c = compiled[90]
    k = KernelBinary.from_compiled(c, ADD_PARAMS)
    assert (k.name, k.arch, k.num_warps, k.shared, k.params) == ("_add", 90, 2, c.metadata.shared, ADD_PARAMS)
    assert (k.global_scratch_size, k.profile_scratch_size) == (0, 0)
    assert k.cubin == c.asm["cubin"] and k.cubin[:4] == b"\x7fELF"
    assert len(k.digest) == 64


@pytest.mark.parametrize("arch", [80, 90, 100])
def test_cubin_arch_reads_the_elf_header(compiled, arch):
    assert cubin_arch(compiled[arch].asm["cubin"]) == arch


def _with_header(abi: int, flags: int) -> bytes:
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    header[8] = abi
    struct.pack_into("<H", header, 0x12, 190)
    struct.pack_into("<I", header, 0x30, flags)
    return bytes(header)


def test_cubin_arch_both_abi_layouts():
    # ABI v1 (ptxas 12.x, <= sm_90): SM in the low byte; v2 (Blackwell, CUDA 13 for all): bits 8-15
    assert cubin_arch(_with_header(7, 0x5A0D5A)) == 90
    assert cubin_arch(_with_header(8, 0x06005A04)) == 90
    assert cubin_arch(_with_header(8, 0x0900640A)) == 100


@pytest.mark.parametrize("data, match", [(b"PK\x03\x04" + bytes(60), "64-bit ELF"),
                                         (b"\x7fELF", "64-bit ELF"),
                                         (_with_header(9, 0x5A), "ABI version 9")])
def test_cubin_arch_refuses_non_cubins(data, match):
    with pytest.raises(CudaRuntimeError, match=match):
        cubin_arch(data)


def test_from_compiled_refuses_wrong_params(compiled):
    with pytest.raises(CudaRuntimeError, match="PTX entry"):
        KernelBinary.from_compiled(compiled[90], ADD_PARAMS[:3])
    with pytest.raises(CudaRuntimeError, match="PTX entry"):  # i64 where the kernel takes i32
        KernelBinary.from_compiled(compiled[90], ADD_PARAMS[:3] + ("i64",))


def test_unknown_param_type_refused():
    with pytest.raises(CudaRuntimeError, match="unsupported parameter type `\\*q7`"):
        KernelBinary("k", 90, b"", 4, 0, ("*q7",))


def _kernel(params: tuple[str, ...]) -> KernelBinary:
    return KernelBinary("k", 90, b"", 4, 0, params)


def test_pack_scalars_bit_exact():
    k = _kernel(("i8", "u32", "i64", "fp16", "bf16", "fp32", "fp64", "i1"))
    block = pack_args(k, [-3, 2**32 - 1, -(2**40), 1.5, -2.5, math.pi, math.e, True], device_index=0)
    slots = [block[i:i + 8] for i in range(0, len(block), 8)]  # one 8-byte slot each, then 2 scratch
    assert len(slots) == 10 and slots[-2:] == [bytes(8)] * 2
    expected = [struct.pack("<b", -3), struct.pack("<I", 2**32 - 1), struct.pack("<q", -(2**40)),
                struct.pack("<e", 1.5), struct.pack("<f", -2.5)[2:],  # bf16: the top half of the fp32 bits
                struct.pack("<f", math.pi), struct.pack("<d", math.e), b"\x01"]
    for slot, want in zip(slots, expected):
        assert slot == want.ljust(8, b"\0")


@pytest.mark.parametrize("params, args, match", [
    (ADD_PARAMS, [1, 2, 3], "takes 4 arguments \\(\\*fp32, \\*fp32, \\*fp32, i32\\), got 3"),
    (("*fp32",), [torch.zeros(2)], "argument 0 \\(`\\*fp32`\\) must be a tensor on cuda:0, got one on cpu"),
    (("*fp32",), [5], "argument 0 \\(`\\*fp32`\\) must be a CUDA tensor, got int"),
    (("i32",), [2**31], "argument 0 \\(`i32`\\) must be an int in"),
    (("i32",), [1.0], "must be an int"),
    (("fp32",), ["x"], "must be a float"),
    (("fp16",), [1e6], "does not fit in fp16"),
    (("bf16",), [1e300], "does not fit in bf16"),
    (("i32", "u8"), [1, -1], "argument 1 \\(`u8`\\) must be an int in \\[0, 255\\], got -1"),
])
def test_pack_refusals(params, args, match):
    with pytest.raises(CudaRuntimeError, match=match):
        pack_args(_kernel(params), args, device_index=0)


def test_import_is_cpu_safe_and_lazy():
    # torch may import parts of cuda.bindings itself: what matters is that we add none and init nothing
    code = ("import sys, torch; before = set(sys.modules); import xgbuild.runtime.cuda; "
            "added = [m for m in set(sys.modules) - before if m.startswith('cuda')]; "
            "assert not added, added; assert not torch.cuda.is_initialized(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_error_is_an_xg_error():
    assert issubclass(CudaRuntimeError, XGError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_launcher_without_gpu_raises_clean_error():
    with pytest.raises(CudaRuntimeError, match="no CUDA device"):
        KernelLauncher()


class _FakeDriver:
    """Stands in for `cuda.bindings.driver`: records calls, returns success, reads the argument block."""

    CUdevice_attribute = type("A", (), {"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 97})
    CUfunction_attribute = type("F", (), {"CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES": 1,
                                          "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": 8})
    CUfunc_cache = type("C", (), {"CU_FUNC_CACHE_PREFER_SHARED": 1})

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.results = {"cuCtxGetCurrent": 7, "cuDevicePrimaryCtxRetain": 7, "cuDeviceGetAttribute": 232448,
                        "cuFuncGetAttribute": 1024, "cuModuleLoadData": 11, "cuModuleGetFunction": 12,
                        "cuDeviceGet": 0}

    def __getattr__(self, name: str):
        def call(*args):
            if name == "cuLaunchKernel":
                slots = ctypes.cast(args[9], ctypes.POINTER(ctypes.c_void_p))
                args = (*args[:9], [ctypes.string_at(slots[i], 8) for i in range(4)])
            self.calls.append((name, args))
            return (0, self.results[name]) if name in self.results else (0,)
        return call


def test_launch_path_with_a_fake_driver(monkeypatch):
    from xgbuild.runtime import cuda

    fake = _FakeDriver()
    monkeypatch.setattr(cuda, "driver_module", lambda: fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    scratch = torch.empty(256 * 6 + 127, dtype=torch.uint8)
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: scratch)

    header = _with_header(7, 0x5A0D5A)
    k = KernelBinary("kern", 90, header, num_warps=8, shared=70_000, params=("i32", "bf16"),
                     global_scratch_size=256, global_scratch_align=128)
    launcher = KernelLauncher(0)
    launcher.launch(k, (2, 3, 1), [5, -2.5])
    launcher.launch(k, (2, 3, 1), [6, 1.0])  # loaded once, launched twice
    names = [name for name, _ in fake.calls]
    assert names.count("cuModuleLoadData") == 1 and names.count("cuLaunchKernel") == 2
    # over 48 KiB: the dynamic limit is raised to opt-in (232448) minus static shared (1024), as Triton does
    assert ("cuFuncSetAttribute", (12, 8, 232448 - 1024)) in fake.calls
    launch = next(args for name, args in fake.calls if name == "cuLaunchKernel")
    assert launch[:9] == (12, 2, 3, 1, 256, 1, 1, 70_000, 0)
    i32, bf16, global_scratch, profile_scratch = launch[9]
    assert i32 == struct.pack("<q", 5) and bf16[:2] == struct.pack("<f", -2.5)[2:]
    address = struct.unpack("<Q", global_scratch)[0]
    assert address % 128 == 0 and scratch.data_ptr() <= address < scratch.data_ptr() + 128
    assert profile_scratch == bytes(8)
