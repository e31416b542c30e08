"""Runs engine kernels with Triton's interpreter on CPU tensors: the numerics of the generated code
checked on hosts without a GPU (tests, `XG_SPMD_KERNELS=interpret` ranks, and the build's
interpreted checks in xgbuild/build/interpreted.py).

TRITON_INTERPRET must be set before Triton is first imported, so callers run this in a fresh
process (`python -m xgbuild.build.interpreted` or a subprocess that sets the variable first).
"""

from __future__ import annotations

from typing import Any

from ..settings import use_triton_interpreter


def enable() -> None:
    """Turns the interpreter on; must run before `triton` is imported in this process."""
    use_triton_interpreter()
    import triton.runtime.interpreter as interp

    if getattr(interp, "_xg_patched", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        # Triton 3.6 holds scalars as 1-element arrays, and numpy >= 2.4 refuses int() on those:
        # a loop bound from an int argument would fail. Read the one element instead.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched

    # Triton 3.6's interpreter holds bfloat16 as uint16 and multiplies those integers in `tl.dot`.
    # Widen bfloat16 operands to float32 first: exact products summed in float32, as tensor cores do.
    dot = interp.InterpreterBuilder.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        import triton.language as tl

        def widen(x: Any) -> Any:
            if x.dtype.scalar != tl.bfloat16:
                return x
            data = interp._convert_float(x.data, tl.bfloat16, tl.float32, None).view(interp.np.float32)
            return interp.TensorHandle(data, tl.float32)
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot

    # Triton 3.6's interpreter narrows float32 to bfloat16 by dropping the low 16 bits (its `.to()`
    # passes no rounding mode), where the GPU rounds to nearest even (PTX `cvt.rn.bf16.f32`):
    # truncation's error is twice rounding's, so a bfloat16 program looked about twice as far from
    # float64 under the interpreter as on a GPU. Round as the GPU does (and as torch does).
    cast = interp.InterpreterBuilder.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        import triton.language as tl
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interp.TensorHandle(bfloat16_bits(src.data), dst_type.scalar)
        return cast(self, src, dst_type)

    interp.InterpreterBuilder.cast_impl = cast_impl
    interp._xg_patched = True


def bfloat16_bits(data: Any) -> Any:
    """float32 values (a numpy array) as bfloat16 bit patterns (uint16), rounded to nearest, ties
    to even; a NaN stays a (quiet) NaN, values past bfloat16's largest round to infinity."""
    import numpy as np
    x = np.ascontiguousarray(data, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(x), ((bits >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)


def launch(compiled: Any, grid: tuple, args: list) -> None:
    """`KernelExecutor` launch function: `compiled.handle` is (jit function, Emitted)."""
    fn, emitted = compiled.handle
    fn[grid](*args, **emitted.constexprs)


def plans_from_manifest(manifest: dict) -> list:
    """An engine's launch plans with each variant's Triton source (re-emitted from its spec and
    config, as the build compiled it) as an interpreted function instead of a cubin."""
    from ..compiler.codegen.build import load_function
    from ..compiler.codegen.launch_abi import Compiled, Variant
    from ..compiler.codegen.templates import emit
    from .plans import plans_from_manifest as plans

    def interpreted(spec, v: dict) -> Compiled:
        variant, cfg = Variant.from_json(v["variant"]), dict(v["config"])
        em = emit(spec, cfg, variant)
        return Compiled(variant, cfg, em.params, em.div16, (load_function(em), em))
    return plans(manifest, None, interpreted)
