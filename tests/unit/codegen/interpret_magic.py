"""The kernels' division by a run-time size (`_udiv` in the emitter's prelude) under Triton's
interpreter: for each divisor, the launch's (m, s) (`launch.div_magic`, m passed as an int32), then
x // d by a multiply for dividends at every edge (0, multiples of d and their neighbours, 2**31 - 1)
and at random. Prints, as JSON, each divisor's number of dividends and of wrong quotients. A
script, not a test: TRITON_INTERPRET must be set before Triton is imported. `report("cuda")` runs the
same kernel compiled for the GPU instead (tests/gpu).

    python tests/unit/codegen/interpret_magic.py
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from importlib import util
from pathlib import Path

import torch

from xgbuild.compiler.codegen.emitter import PRELUDE
from xgbuild.compiler.codegen.launch import div_magic

DIVISORS = [1, 2, 3, 5, 7, 12, 20, 37, 64, 768, 1000, 2304, 50257, 65535, 65536, 65537,
            (1 << 20) - 1, (1 << 24) - 1, (1 << 24) + 1, 123456789, (1 << 30) - 1, 1 << 30,
            (1 << 30) + 1, (1 << 31) - 1]
KERNEL = '''

@triton.jit(do_not_specialize=["m", "s"])
def divide(x_ptr, q_ptr, m, s, n, BLOCK: tl.constexpr):
    # (m and s as plain int32 parameters, as XG's kernels declare them: Triton's JIT would make a
    # 1 a constant.)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    x = tl.load(x_ptr + offs, mask=keep, other=0)
    tl.store(q_ptr + offs, _udiv(x, m, s), mask=keep)
'''


def dividends(d: int, rng: random.Random) -> list[int]:
    top = (1 << 31) - 1
    xs = {0, 1, top, top - 1, d - 1, d, d + 1}
    for k in (1, 2, 3, top // d - 1, top // d, top // d + 1):
        xs |= {k * d - 1, k * d, k * d + 1}
    xs |= {rng.randrange(0, top + 1) for _ in range(200)}
    xs |= {rng.randrange(0, min(top, 64 * d) + 1) for _ in range(200)}
    return sorted(x for x in xs if 0 <= x <= top)


def report(device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "magic_kernel.py"
        path.write_text(PRELUDE + KERNEL)
        spec = util.spec_from_file_location("magic_kernel", path)
        mod = util.module_from_spec(spec)
        sys.modules["magic_kernel"] = mod
        spec.loader.exec_module(mod)
        rng = random.Random(20261128)
        out = {}
        for d in DIVISORS:
            xs = dividends(d, rng)
            x = torch.tensor(xs, dtype=torch.int32, device=device)
            q = torch.empty_like(x)
            m, s = div_magic(d)
            assert -2**31 <= m < 2**31 and 0 <= s <= 31
            mod.divide[(triton_cdiv(len(xs), 128),)](x, q, m, s, len(xs), BLOCK=128)
            want = torch.tensor([v // d for v in xs], dtype=torch.int32, device=device)
            out[str(d)] = {"n": len(xs), "wrong": int((q != want).sum())}
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    print(json.dumps(report(sys.argv[1] if len(sys.argv) > 1 else "cpu")))
