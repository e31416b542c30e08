"""GPU tests of `xgbuild.runtime.cuda.KernelLauncher`: Triton kernels compiled ahead of time, launched
through the CUDA driver API only (never Triton's launcher), checked against torch float64.

Every output starts as NaN so that an element the kernel fails to write is caught.
"""

from __future__ import annotations

import functools
import math
import threading

import pytest
import torch
from kernels_for_tests import build

from xgbuild.runtime.cuda import CudaRuntimeError, KernelBinary, KernelLauncher, device_arch

pytestmark = pytest.mark.gpu

DEV = "cuda:0"


@pytest.fixture(scope="module")
def launcher() -> KernelLauncher:
    return KernelLauncher(0)


@functools.cache
def kernel(name: str, arch: int | None = None, **config) -> KernelBinary:
    """One test kernel compiled for the device (or `arch`); config splits into constexprs and options."""
    options = {o: config.pop(o) for o in ("num_warps", "num_stages") if o in config}
    return build(name, arch or device_arch(), config, **options)


def poisoned(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def test_device_arch_matches_torch():
    major, minor = torch.cuda.get_device_capability(0)
    assert device_arch(0) == major * 10 + minor
    print(f"\ndevice: {torch.cuda.get_device_name(0)}, sm_{device_arch(0)}")


def test_vector_add(launcher):
    k = kernel("add", BLOCK=1024)
    n = 100_003
    x, y = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
    out = poisoned(n + 1024)
    launcher.launch(k, (math.ceil(n / 1024), 1, 1), [x, y, out, n])
    torch.cuda.synchronize()
    assert torch.isfinite(out[:n]).all() and torch.isnan(out[n:]).all()  # n arrived: the mask held
    assert rel_err(out[:n], x.double() + y.double()) < 1e-7


def test_row_softmax_bf16(launcher):
    k = kernel("softmax", BLOCK=1024)
    rows, cols, stride = 37, 1000, 1024
    x = torch.randn(rows, stride, device=DEV).to(torch.bfloat16)[:, :cols]  # strided rows: i64 param
    out = poisoned(rows, cols)
    launcher.launch(k, (rows, 1, 1), [x, out, stride, cols, 0.7])
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert rel_err(out, torch.softmax(x.double() * 0.7, dim=1)) < 1e-5


@pytest.mark.parametrize("size, config", [
    (64, {"BM": 64, "BN": 64, "BK": 64}),
    (256, {"BM": 128, "BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3}),  # > 48 KiB shared
])
def test_matmul_fp16(launcher, size, config):
    k = kernel("matmul", **config)
    assert k.shared > (48 * 1024 if size == 256 else 0)
    a, b = torch.randn(size, size, device=DEV).half(), torch.randn(size, size, device=DEV).half()
    c = poisoned(size, size)
    launcher.launch(k, (size // config["BM"], size // config["BN"], 1), [a, b, c, size, size, size])
    torch.cuda.synchronize()
    assert torch.isfinite(c).all()
    assert rel_err(c, a.double() @ b.double()) < 1e-5


def test_global_scratch_kernel(launcher):
    k = kernel("tma_scale", BM=32, BN=32)
    assert k.global_scratch_size > 0  # in-kernel tensor descriptors live in the global scratch
    m, n = 96, 128
    x = torch.randn(m, n, device=DEV)
    out = poisoned(m, n)
    launcher.launch(k, (m // 32, n // 32, 1), [x, out, m, n])
    torch.cuda.synchronize()
    assert torch.equal(out, 2 * x)


def test_every_scalar_type_arrives(launcher):
    k = kernel("scalars", num_warps=1)
    values = [-100, -30000, -2_000_000_000, -(2**52) + 3, 4_000_000_000, 2**63 + 2**11,
              1.5, -2.5, 3.25, math.pi, True]
    out = poisoned(len(values), dtype=torch.float64)
    launcher.launch(k, (1, 1, 1), [out, *values])
    torch.cuda.synchronize()
    assert out.tolist() == [float(v) for v in values]


def test_launch_on_a_side_stream(launcher):
    k = kernel("add", BLOCK=1024)
    n = 4096
    x, y = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
    out = poisoned(n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    launcher.launch(k, (n // 1024, 1, 1), [x, y, out, n], stream=side.cuda_stream)
    side.synchronize()
    assert rel_err(out, x.double() + y.double()) < 1e-7


def test_threads_share_a_launcher(launcher):
    k = kernel("add", BLOCK=1024)
    n = 1 << 14
    xs = [torch.randn(n, device=DEV) for _ in range(4)]
    outs = [poisoned(n) for _ in range(4)]

    def work(t: int) -> None:  # a new thread has no current CUDA context: the launcher pushes its own
        for _ in range(50):
            launcher.launch(k, (n // 1024, 1, 1), [xs[t], xs[t], outs[t], n])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert all(torch.equal(out, 2 * x) for x, out in zip(xs, outs))


def test_empty_grid_is_a_no_op(launcher):
    out = poisoned(8)
    launcher.launch(kernel("add", BLOCK=1024), (0, 1, 1), [out, out, out, 8])
    torch.cuda.synchronize()
    assert torch.isnan(out).all()


def test_arch_mismatch_refused(launcher):
    arch = device_arch()
    other = 100 if arch != 100 else 90
    with pytest.raises(CudaRuntimeError, match=f"built for sm_{other}, device is sm_{arch}"):
        launcher.load(kernel("add", other, BLOCK=1024))


def test_bad_arguments_refused(launcher):
    k = kernel("add", BLOCK=1024)
    x = torch.randn(16, device=DEV)
    with pytest.raises(CudaRuntimeError, match="argument 1 \\(`\\*fp32`\\) must be a torch.float32 tensor, "
                                               "got torch.float64"):
        launcher.launch(k, (1, 1, 1), [x, x.double(), x, 16])
    with pytest.raises(CudaRuntimeError, match="takes 4 arguments .* got 3"):
        launcher.launch(k, (1, 1, 1), [x, x, x])
    with pytest.raises(CudaRuntimeError, match="argument 2 .* on cuda:0, got one on cpu"):
        launcher.launch(k, (1, 1, 1), [x, x, x.cpu(), 16])
    with pytest.raises(CudaRuntimeError, match="grid must be 3 non-negative ints"):
        launcher.launch(k, (1, 1), [x, x, x, 16])


def test_driver_errors_name_the_call_and_the_cuda_error(launcher):
    k = kernel("add", BLOCK=1024)
    x = torch.randn(1024, device=DEV)
    with pytest.raises(CudaRuntimeError, match="cuLaunchKernel\\(add_kernel\\) failed: CUDA_ERROR_INVALID_VALUE"):
        launcher.launch(k, (1, 70_000, 1), [x, x, x, 1024])  # gridDim.y is at most 65535
    broken = KernelBinary(**{**{f: getattr(k, f) for f in k.__dataclass_fields__},
                             "cubin": k.cubin[:64] + bytes(len(k.cubin) - 64)})
    with pytest.raises(CudaRuntimeError, match="cuModuleLoadData\\(add_kernel\\) failed: CUDA_ERROR_"):
        launcher.load(broken)
    out = poisoned(1024)
    launcher.launch(k, (1, 1, 1), [x, x, out, 1024])  # neither error is sticky: the context still works
    torch.cuda.synchronize()
    assert torch.equal(out, 2 * x)


def test_module_cached_by_cubin_digest(launcher):
    k = kernel("add", BLOCK=1024)
    twin = KernelBinary(**{f: getattr(k, f) for f in k.__dataclass_fields__})
    assert launcher.load(k) is launcher.load(twin)


def test_thousand_launches_no_error_no_leak(launcher):
    from cuda.bindings import driver

    add, tma = kernel("add", BLOCK=1024), kernel("tma_scale", BM=32, BN=32)
    n = 1 << 16
    x = torch.randint(-3, 4, (n,), device=DEV).float()  # small integers: 1000 sums stay exact
    y = torch.randn(n, device=DEV)
    out = y.clone()
    src, dst = torch.randn(64, 64, device=DEV), poisoned(64, 64)

    def one_round():
        launcher.launch(add, (n // 1024, 1, 1), [x, out, out, n])
        launcher.launch(tma, (2, 2, 1), [src, dst, 64, 64])  # allocates scratch every launch

    one_round()
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    free_before = driver.cuMemGetInfo()[1]
    for _ in range(999):
        one_round()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated and torch.cuda.memory_reserved() == reserved
    assert abs(driver.cuMemGetInfo()[1] - free_before) < 4 << 20
    assert rel_err(out, y.double() + 1000 * x.double()) < 1e-6
    assert torch.equal(dst, 2 * src)
