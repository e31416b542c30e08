"""Small Triton kernels for the CUDA launcher tests, and `build()`, which compiles one ahead of time.

`build` uses only `triton.compile` with an explicit `GPUTarget`, never Triton's launcher, so the
same code runs on a CPU-only host; the tests launch the results through `KernelLauncher`.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from xgbuild.runtime.cuda import KernelBinary


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, row_stride, n_cols, scale, BLOCK: tl.constexpr):
    """Row softmax of `scale * x` (bf16 in, fp32 out), one program per row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32) * scale
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C = A @ B for row-major fp16 A (MxK), B (KxN), fp32 C; M, N, K multiples of the tile."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


@triton.jit
def tma_scale_kernel(x_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """out = 2 * x through tensor descriptors made in the kernel: these live in global scratch."""
    pm = tl.program_id(0) * BM
    pn = tl.program_id(1) * BN
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    od = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    od.store([pm, pn], xd.load([pm, pn]) * 2.0)


@triton.jit
def scalars_kernel(out_ptr, a, b, c, d, e, f, g, h, i, j, k):
    """Writes each scalar parameter, widened to fp64, to out[0..10]: checks how each type is passed."""
    tl.store(out_ptr + 0, a.to(tl.float64))
    tl.store(out_ptr + 1, b.to(tl.float64))
    tl.store(out_ptr + 2, c.to(tl.float64))
    tl.store(out_ptr + 3, d.to(tl.float64))
    tl.store(out_ptr + 4, e.to(tl.float64))
    tl.store(out_ptr + 5, f.to(tl.float64))
    tl.store(out_ptr + 6, g.to(tl.float64))
    tl.store(out_ptr + 7, h.to(tl.float64))
    tl.store(out_ptr + 8, i.to(tl.float64))
    tl.store(out_ptr + 9, j.to(tl.float64))
    tl.store(out_ptr + 10, k.to(tl.float64))


SCALAR_TYPES = ("i8", "i16", "i32", "i64", "u32", "u64", "fp16", "bf16", "fp32", "fp64", "i1")

SIGNATURES = {
    "add": (add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}),
    "softmax": (softmax_kernel, {"x_ptr": "*bf16", "out_ptr": "*fp32", "row_stride": "i64",
                                 "n_cols": "i32", "scale": "fp32"}),
    "matmul": (matmul_kernel, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32",
                               "M": "i32", "N": "i32", "K": "i32"}),
    "tma_scale": (tma_scale_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32"}),
    "scalars": (scalars_kernel, {"out_ptr": "*fp64", **dict(zip("abcdefghijk", SCALAR_TYPES))}),
}


def compile_kernel(name: str, arch: int, constexprs: dict[str, int] | None = None, **options):
    """`triton.compile` of one kernel above for sm_`arch`; returns Triton's CompiledKernel and params."""
    fn, params = SIGNATURES[name]
    constexprs = constexprs or {}
    signature = {**params, **{c: "constexpr" for c in constexprs}}
    compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    return compiled, tuple(params.values())


def build(name: str, arch: int, constexprs: dict[str, int] | None = None, **options) -> KernelBinary:
    """Compiles one kernel ahead of time and wraps it as the `KernelBinary` an engine would store."""
    compiled, params = compile_kernel(name, arch, constexprs, **options)
    return KernelBinary.from_compiled(compiled, params)
