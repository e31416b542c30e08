"""One kernel compile, as a compile worker runs it: Triton only, no torch.

A worker process (`workers.py`) imports this module and `compiler.codegen.build`, which import
neither torch nor the rest of XG, so that sixteen workers start in a fraction of a second each
instead of paying `import torch` sixteen times over (seconds of a cold build on a busy host).
The result is plain data; `KernelBinary` is made from it in the tuner's process (`binary_of`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

_METADATA = ("name", "num_warps", "shared", "num_ctas", "launch_cooperative_grid", "launch_pdl",
             "global_scratch_size", "global_scratch_align", "profile_scratch_size", "profile_scratch_align")


@dataclass
class _Source:
    """What `compile_emitted` reads of an `Emitted` (the same fields and `signature`)."""
    name: str
    source: str
    params: list[tuple[str, str]]
    constexprs: dict[str, int]
    div16: list[str] = field(default_factory=list)
    aligned: bool = False

    @property
    def signature(self) -> dict[str, str]:
        return {**dict(self.params), **{c: "constexpr" for c in self.constexprs}}


def compile_job(source: str, name: str, params: list, constexprs: dict, div16: list, aligned: bool, arch: int,
                num_warps: int, num_stages: int) -> dict:
    """Compile one emitted kernel for sm_`arch`: its cubin, PTX and launch metadata."""
    from ..compiler.codegen.build import compile_emitted
    t0 = time.perf_counter()
    ck = compile_emitted(_Source(name, source, [tuple(p) for p in params], constexprs, div16, aligned),
                         arch, num_warps, num_stages)
    md = ck.metadata
    meta = {k: getattr(md, k, 1 if k == "num_ctas" else 0) for k in _METADATA}
    meta["arch"] = int(md.target.arch)
    return {"metadata": meta, "cubin": bytes(ck.asm["cubin"]), "ptx": ck.asm.get("ptx", ""),
            "seconds": time.perf_counter() - t0}


# A kernel small enough to compile in a fraction of a second, for `warm`.
_WARM_SOURCE = """import triton
import triton.language as tl


@triton.jit
def xg_warm(x_ptr, n):
    i = tl.program_id(0) * 128 + tl.arange(0, 128)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)
"""


def warm(arch: int) -> None:
    """Make a worker's first real compile as fast as its later ones: import Triton and compile one
    tiny kernel for sm_`arch` (Triton's first compile in a process also loads its compiler library
    and asks ptxas its version: 0.7-0.9 s of the first compile on a CPU host). A warm-up that fails
    is left for the first real compile to report."""
    try:
        compile_job(_WARM_SOURCE, "xg_warm", [("x_ptr", "*fp32"), ("n", "i32")], {}, [], False, arch, 4, 1)
    except Exception:  # noqa: BLE001 (an optimisation only)
        pass


class _Compiled:
    """A `triton.compile` result's shape, rebuilt from `compile_job`'s data for `KernelBinary.from_compiled`."""

    def __init__(self, data: dict) -> None:
        from types import SimpleNamespace
        meta = dict(data["metadata"])
        meta["target"] = SimpleNamespace(arch=meta.pop("arch"))
        self.metadata = SimpleNamespace(**meta)
        self.asm = {"cubin": data["cubin"], "ptx": data["ptx"]}


def binary_of(data: dict, params: list) -> Any:
    """The `KernelBinary` of a `compile_job` result (checked as `from_compiled` checks Triton's own)."""
    from ..runtime.cuda import KernelBinary
    return KernelBinary.from_compiled(_Compiled(data), [t for _, t in params])
