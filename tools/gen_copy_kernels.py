"""Writes xgbuild/runtime/copy_kernels.json: the deploy runtime's strided-copy kernels as PTX.

The deploy runtime copies a view into fresh memory where a reshape cannot be a view (torch's
executor does it with a torch kernel; the deploy runtime has no torch). The kernel is Triton's,
compiled here once per element size (1, 2, 4, 8 bytes: copies move bits, so integer types
serve every dtype) to PTX for sm_80; the driver compiles the PTX for the GPU it runs on when the
runtime loads it (PTX runs on its target and every later architecture). Run this after a Triton
upgrade; tests/unit/runtime/test_copy_kernels.py checks the file is what this writes.

    python tools/gen_copy_kernels.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "xgbuild" / "runtime" / "copy_kernels.json"
RANK = 4                # dims the kernel indexes; a view of more (after merging) is copied in pieces
ARCH = 80
NUM_WARPS = 4
BLOCK = 1024
TYPES = {1: "i8", 2: "i16", 4: "i32", 8: "i64"}


def kernels() -> dict:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def xg_strided_copy(src, dst, n, s1, s2, s3, t0, t1, t2, t3, BLOCK: tl.constexpr):
        # dst[i] = src[offset of element i], dst contiguous of sizes (s0, s1, s2, s3), src strides t0..t3
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        mask = offs < n
        i3 = offs % s3
        r = offs // s3
        i2 = r % s2
        r = r // s2
        i1 = r % s1
        i0 = r // s1
        x = tl.load(src + (i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3), mask=mask)
        tl.store(dst + offs, x, mask=mask)

    out = {}
    for size, ty in TYPES.items():
        sig = {"src": f"*{ty}", "dst": f"*{ty}", "n": "i64", **{f"s{d}": "i64" for d in (1, 2, 3)},
               **{f"t{d}": "i64" for d in range(RANK)}, "BLOCK": "constexpr"}
        compiled = triton.compile(ASTSource(xg_strided_copy, sig, {"BLOCK": BLOCK}),
                                  target=GPUTarget("cuda", ARCH, 32), options={"num_warps": NUM_WARPS})
        md = compiled.metadata
        out[str(size)] = {"entry": md.name, "num_warps": md.num_warps, "shared": md.shared,
                          "param_types": [t for k, t in sig.items() if t != "constexpr"],
                          "global_scratch": [md.global_scratch_size, md.global_scratch_align],
                          "profile_scratch": [md.profile_scratch_size, md.profile_scratch_align],
                          "ptx": compiled.asm["ptx"]}
    return {"triton": triton.__version__, "arch": ARCH, "rank": RANK, "block": BLOCK, "kernels": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the file is not what this writes")
    args = ap.parse_args()
    text = json.dumps(kernels(), indent=1, sort_keys=True) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT}: {'up to date' if same else 'STALE: run tools/gen_copy_kernels.py'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
