"""Compiles emitted Triton source for a target arch, on any host: no GPU needed.

The source goes to a file named by its own digest (Triton reads kernels back with `inspect`), and
line info is turned off, so the cubin holds no path and two builds give the same bytes. ptxas runs
without address-space randomisation (`_reproducible_ptxas`): Blackwell's ptxas (CUDA 12.9, as
Triton 3.6 bundles it) ordered some of its work by heap addresses, and the same PTX of a bf16
matmul gave one of two cubins run to run (sm_90's ptxas did not), so two clean GB200 builds of one
engine could differ.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:       # (not imported at run time: compile workers load this module without torch)
    from .emitter import Emitted


def source_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"xg-triton-src-{os.getuid() if hasattr(os, 'getuid') else 0}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_function(emitted: Emitted) -> Any:
    """The `@triton.jit` function of `emitted` (an interpreted one under TRITON_INTERPRET=1)."""
    digest = hashlib.sha256(emitted.source.encode()).hexdigest()[:24]
    module_name = f"xg_kernel_{digest}"
    mod = sys.modules.get(module_name)
    if mod is None:
        path = source_dir() / f"{module_name}.py"
        if not path.exists() or path.read_text() != emitted.source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(emitted.source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(module_name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = mod
        spec.loader.exec_module(mod)
    return getattr(mod, emitted.name)


ADDR_NO_RANDOMIZE = 0x0040000     # linux/personality.h


@functools.lru_cache(maxsize=1)
def _reproducible_ptxas() -> bool:
    """Programs this process starts from now on (Triton's ptxas) run without address-space
    randomisation: the personality flag is inherited across exec, so ptxas's heap addresses, and
    with them its output, are the same run to run. Whether it took: not on other systems, or where
    a seccomp policy refuses the call (the build is still right, not always bit-identical)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        personality = ctypes.CDLL(None, use_errno=True).personality
        personality.restype = ctypes.c_int
        current = personality(ctypes.c_ulong(0xFFFFFFFF))       # (0xffffffff: query only)
        return current != -1 and personality(ctypes.c_ulong(current | ADDR_NO_RANDOMIZE)) != -1
    except (OSError, AttributeError):
        return False


def compile_emitted(emitted: Emitted, arch: int, num_warps: int, num_stages: int):
    """`triton.compile` for sm_`arch`; returns Triton's CompiledKernel."""
    _reproducible_ptxas()
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = load_function(emitted)
    index = {name: i for i, name in enumerate(fn.arg_names)}
    attrs = {(index[name],): [["tt.divisibility", 16]] for name in emitted.div16}
    for name, ty in emitted.params:
        if ty.startswith("*") and emitted.aligned:     # aligned variants: every pointer 16-byte aligned
            attrs[(index[name],)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, emitted.signature, emitted.constexprs, attrs)
    old = knobs.compilation.disable_line_info
    knobs.compilation.disable_line_info = True
    try:
        return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    finally:
        knobs.compilation.disable_line_info = old
