"""The interpreter's numerics where Triton 3.6's own differ from a GPU's (`runtime/interpret.py`):
float32 narrowed to bfloat16 by `.to()` (round to nearest even, as PTX's `cvt.rn.bf16.f32` and
torch; Triton's interpreter truncates), over random values of every magnitude, exact ties, the
largest finite values, infinities, NaN and subnormals; and a bfloat16 `tl.dot` (exact products,
float32 sums). Prints, as JSON, the fraction of casts equal to torch's bit for bit and the dot's
error against float64. A script, not a test: TRITON_INTERPRET must be set before Triton is
imported, so the test runs it in a fresh process."""

from __future__ import annotations

import json

import torch

from xgbuild.runtime import interpret


def main() -> None:
    interpret.enable()
    import triton
    import triton.language as tl

    @triton.jit
    def narrow(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n).to(tl.bfloat16), mask=i < n)

    @triton.jit
    def dot(a, b, c, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        x = tl.load(a + rm[:, None] * K + rk[None, :])
        w = tl.load(b + rk[:, None] * N + rn[None, :])
        tl.store(c + rm[:, None] * N + rn[None, :], tl.dot(x, w))

    gen = torch.Generator().manual_seed(0)
    n = 1 << 15
    x = torch.randn(n, generator=gen) * torch.logspace(-44, 38, n)
    specials = [float("nan"), float("inf"), -float("inf"), 3.4e38, -3.4e38, 3.3895e38, 0.0, -0.0, 1e-45, -1e-40]
    x[:len(specials)] = torch.tensor(specials)
    # exact ties between two bfloat16 values (the low 16 bits 0x8000), both parities of the last kept bit
    ties = torch.arange(64, dtype=torch.int32) * 0x10000 + 0x3F808000
    x[16:80] = ties.view(torch.float32) * torch.where(torch.arange(64) % 3 == 0, -1.0, 1.0)
    y = torch.empty(n, dtype=torch.bfloat16)
    narrow[(n // 1024,)](x, y, n, BLOCK=1024)
    ref = x.to(torch.bfloat16)
    same = (y.view(torch.int16) == ref.view(torch.int16)) | (torch.isnan(y) & torch.isnan(ref))
    a = torch.randn(32, 64, generator=gen).bfloat16()
    b = torch.randn(64, 16, generator=gen).bfloat16()
    c = torch.empty(32, 16)
    dot[(1,)](a, b, c, M=32, N=16, K=64)
    want = a.double() @ b.double()
    print(json.dumps({"narrow_equal": same.double().mean().item(), "nan_kept": bool(torch.isnan(y[0])),
                      "dot_err": ((c.double() - want).norm() / want.norm()).item()}))


if __name__ == "__main__":
    main()
